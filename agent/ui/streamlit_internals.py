"""What the page's live loop asks of Streamlit's script runner, which has no public way to tell it or ask it.

The follower holds its fragment run for seconds, so it must notice, between two slices of waiting,
that a click waits for it. This is the only module of the product that imports `streamlit.runtime`;
each function names the internal it reads, and tests/test_streamlit_internals.py checks each one
against the installed Streamlit, so an upgrade that moves one fails a test instead of quietly
slowing the page's answers to clicks. Read defensively: an internal that has moved reads as "nothing
waits", and a follower run then simply lasts its whole hold before it gives way.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData, ScriptRequestType
from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState

YIELD_PROBE_KEY = "agent_yield_probe"  # a session key read only to reach the runner's yield point


def yield_to_waiting_reruns() -> None:
    """A yield point: a full run waiting (a click outside this fragment) ends this run here.

    Relies on `SafeSessionState.__contains__` calling the script runner's yield callback
    (`ScriptRunner._maybe_handle_execution_control_request`), which raises the waiting rerun: reading
    session state is a yield point that draws nothing. A fragment's rerun does not pre-empt a run here
    (`ScriptRequests.on_scriptrunner_yield` keeps it waiting): `fragment_rerun_waiting` tells of those."""
    _ = YIELD_PROBE_KEY in st.session_state


def waiting_fragment_ids(requests: object) -> list[str]:
    """The fragments whose reruns wait for the running one to end, in the order they will run.

    Relies on `ScriptRequests._state` being `ScriptRequestType.RERUN` while a rerun waits, and on the
    waiting `RerunData.fragment_id_queue` in `ScriptRequests._rerun_data` (empty for a full run)."""
    if getattr(requests, "_state", None) != ScriptRequestType.RERUN:
        return []
    return list(getattr(getattr(requests, "_rerun_data", None), "fragment_id_queue", None) or [])


def fragment_rerun_waiting() -> bool:
    """Another fragment's rerun waits (this fragment's own ticks only queue its next run, which can wait).

    Relies on `ScriptRunContext.script_requests`, the run's request queue (see `waiting_fragment_ids`)."""
    requests = getattr(get_script_run_ctx(), "script_requests", None)
    this = this_fragment_id()
    return any(fragment_id != this for fragment_id in waiting_fragment_ids(requests))


def in_fragment_run() -> bool:
    """This run reruns fragments alone, not the whole page.

    Relies on `ScriptRunContext.fragment_ids_this_run`: the fragments a fragment run runs, None in a full run."""
    return bool(getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


def this_fragment_id() -> str | None:
    """The fragment whose body runs now; None outside a fragment.

    Relies on `ThreadState.get()` returning the run's `FragmentThreadState`, whose `fragment_id` is
    the running fragment's id."""
    try:
        return ThreadState.get().fragment_id
    except (RuntimeError, AttributeError):  # no script run here, or the internal moved
        return None


def queued_after_this_fragment() -> bool:
    """This run goes on to other fragments once this one returns (Stop clicked just as the follower's tick came).

    Relies on `ScriptRunContext.fragment_ids_this_run` holding them in the order they run."""
    return others_run_after(this_fragment_id(), getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


def others_run_after(this: str | None, fragment_ids_this_run: Sequence[str] | None) -> bool:
    """Whether the run's queue of fragments goes on past `this` one (they run in the queue's order)."""
    queued = list(fragment_ids_this_run or ())
    return this in queued and queued.index(this) < len(queued) - 1


def request_fragment_run(fragment_id: str | None) -> bool:
    """Ask for a run of the fragment `fragment_id` right after this run ends, as a click inside it would: it
    does not cut this run short, and this run still ends as finished (so the browser drops whatever of the
    run before it this one did not draw over). False when it could not be asked (nothing else happens then).

    Relies on `ScriptRunContext.script_requests.request_rerun` taking a `RerunData` whose `fragment_id_queue`
    names the fragment, without `is_fragment_scoped_rerun` (which would cut this run short), the same fields
    `st.rerun` fills from the context (`query_string`, `page_script_hash`, `cached_message_hashes`,
    `context_info`)."""
    ctx = get_script_run_ctx()
    requests = getattr(ctx, "script_requests", None)
    if not fragment_id or requests is None:
        return False
    try:
        data = RerunData(query_string=ctx.query_string, page_script_hash=ctx.page_script_hash,
                         fragment_id_queue=[fragment_id], is_fragment_scoped_rerun=False,
                         cached_message_hashes=ctx.cached_message_hashes, context_info=ctx.context_info)
        return bool(requests.request_rerun(data))
    except (AttributeError, TypeError):  # an internal moved: the follower's tick starts it instead
        return False


def children_drawn(container: object) -> int | None:
    """How many elements (and blocks) this run has drawn so far directly in `container` (an st.container()),
    or None when that cannot be read.

    Relies on `DeltaGenerator._cursor` being the container's `RunningCursor`, whose `index` is the place of its
    next child."""
    index = getattr(getattr(container, "_cursor", None), "index", None)
    return index if isinstance(index, int) else None
