"""The Streamlit internals the page's live loop relies on (agent/ui/streamlit_internals.py), one test each.

Streamlit has no public way to tell a running fragment that a click waits, so the follower reads its
script runner. Should an upgrade move one of these, the page would not break: its answers to clicks
would quietly wait up to a follower's whole hold. These tests fail instead, naming the internal and
the Streamlit version, so the upgrade comes with a fix to that one module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
from pathlib import Path

import pytest
import streamlit
from streamlit.testing.v1 import AppTest

from agent.ui import streamlit_internals as internals

MODULE = "agent/ui/streamlit_internals.py"


def moved(internal: str, relied_on_by: str, how: str) -> str:
    """The failure message: which internal, in which Streamlit, and what in the page relies on it."""
    return (f"Streamlit {streamlit.__version__}: {internal} {how}. The page's live loop relies on it in "
            f"{MODULE} ({relied_on_by}); adapt that function to this Streamlit, or pin the version it was written for.")


def fields(cls: type) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


# -- one test per internal -------------------------------------------------------------------------


def test_reading_session_state_is_a_yield_point_of_the_script_runner():
    from streamlit.runtime.scriptrunner.script_runner import ScriptRunner
    from streamlit.runtime.state.safe_session_state import SafeSessionState
    from streamlit.runtime.state.session_state import SessionState

    yields: list[bool] = []
    session = SafeSessionState(SessionState(), yield_callback=lambda: yields.append(True))
    _ = internals.YIELD_PROBE_KEY in session
    assert yields, moved("SafeSessionState.__contains__", "yield_to_waiting_reruns",
                         "no longer calls its yield callback")
    source = inspect.getsource(ScriptRunner.__init__)
    assert "yield_callback=self._maybe_handle_execution_control_request" in source, moved(
        "ScriptRunner's session state", "yield_to_waiting_reruns",
        "no longer yields to _maybe_handle_execution_control_request, where a waiting rerun is raised")


def test_a_waiting_fragment_rerun_does_not_pre_empt_a_run_and_a_full_rerun_does():
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData, ScriptRequests, ScriptRequestType

    requests = ScriptRequests()
    requests.request_rerun(RerunData(fragment_id="stop"))  # a click in another fragment, while one runs
    assert requests.on_scriptrunner_yield() is None, moved(
        "ScriptRequests.on_scriptrunner_yield", "yield_to_waiting_reruns, fragment_rerun_waiting",
        "now lets a fragment's rerun pre-empt the running script")
    requests.request_rerun(RerunData())  # a click outside
    request = requests.on_scriptrunner_yield()
    assert request is not None and request.type == ScriptRequestType.RERUN, moved(
        "ScriptRequests.on_scriptrunner_yield", "yield_to_waiting_reruns",
        "no longer hands a full rerun to a yield point")


def test_the_request_queue_keeps_the_waiting_fragment_ids_in_its_rerun_data():
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData, ScriptRequests, ScriptRequestType

    requests = ScriptRequests()
    for attribute in ("_state", "_rerun_data"):
        assert hasattr(requests, attribute), moved(f"ScriptRequests.{attribute}", "waiting_fragment_ids", "is gone")
    assert "fragment_id_queue" in fields(RerunData), moved("RerunData.fragment_id_queue", "waiting_fragment_ids",
                                                           "is gone")
    assert internals.waiting_fragment_ids(requests) == []
    requests.request_rerun(RerunData(fragment_id="stop"))
    requests.request_rerun(RerunData(fragment_id="follow"))
    assert requests._state == ScriptRequestType.RERUN, moved("ScriptRequests._state", "waiting_fragment_ids",
                                                             "is no longer RERUN while a rerun waits")
    assert internals.waiting_fragment_ids(requests) == ["stop", "follow"], moved(
        "ScriptRequests._rerun_data.fragment_id_queue", "waiting_fragment_ids",
        "no longer lists the waiting fragments in the order they run")
    requests.request_rerun(RerunData())  # a full run pre-empts anyway: no fragment to let through
    assert internals.waiting_fragment_ids(requests) == []


def test_the_script_run_context_carries_the_request_queue_and_the_fragments_this_run_runs():
    from streamlit.runtime.scriptrunner import get_script_run_ctx  # noqa: F401 - where the module imports it
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext

    for field in ("script_requests", "fragment_ids_this_run"):
        assert field in fields(ScriptRunContext), moved(
            f"ScriptRunContext.{field}", "fragment_rerun_waiting, in_fragment_run, queued_after_this_fragment",
            "is gone")


def test_the_thread_state_names_the_running_fragment():
    from streamlit.runtime.scriptrunner_utils.script_run_context import FragmentThreadState, ThreadState

    assert callable(getattr(ThreadState, "get", None)), moved("ThreadState.get", "this_fragment_id", "is gone")
    assert "fragment_id" in fields(FragmentThreadState), moved("FragmentThreadState.fragment_id",
                                                               "this_fragment_id", "is gone")


# -- the same, inside real script runs ---------------------------------------------------------------


PAST_THE_YIELD = "AGENT_TEST_PAST_THE_YIELD"  # the environment carries it out of the script run


def _script() -> None:
    import os

    import streamlit as st
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

    from agent.ui import streamlit_internals as internals

    PAST_THE_YIELD = "AGENT_TEST_PAST_THE_YIELD"  # noqa: N806 - the script runs on its own, without this module
    runs = st.session_state["runs"] = st.session_state.get("runs", 0) + 1
    st.text(f"full run {runs}: in a fragment run {internals.in_fragment_run()}, "
            f"fragment {internals.this_fragment_id()}")

    @st.fragment
    def live() -> None:
        st.text(f"fragment {internals.this_fragment_id()}: in a fragment run {internals.in_fragment_run()}, "
                f"others after it {internals.queued_after_this_fragment()}")

    live()
    if runs == 1:  # what this run did past each yield point goes out of the run, which the rerun replaces
        requests = get_script_run_ctx().script_requests
        requests.request_rerun(RerunData(fragment_id="elsewhere"))  # another fragment's click
        internals.yield_to_waiting_reruns()
        os.environ[PAST_THE_YIELD] = f"a fragment waits {internals.fragment_rerun_waiting()}"
        requests.request_rerun(RerunData())  # a click outside: this run ends at the next yield point
        internals.yield_to_waiting_reruns()
        os.environ[PAST_THE_YIELD] += ", and this run went on past a waiting full run"


def _texts(at: AppTest) -> list[str]:
    return [element.value for element in at.text]


def test_inside_a_script_run_the_loop_sees_waiting_reruns_and_the_running_fragment(monkeypatch):
    monkeypatch.delenv(PAST_THE_YIELD, raising=False)
    at = AppTest.from_function(_script).run(timeout=30)
    assert not at.exception, [e.value for e in at.exception]
    went_on = os.environ.get(PAST_THE_YIELD)
    assert went_on is not None, moved("ScriptRequests.on_scriptrunner_yield", "yield_to_waiting_reruns",
                                      "ended the run for another fragment's rerun")
    assert went_on == "a fragment waits True", moved(
        "the script runner's yield point in session state", "yield_to_waiting_reruns, fragment_rerun_waiting",
        f"did not tell, or did not end the run for, a waiting rerun ({went_on!r})")
    shown = _texts(at)
    assert at.session_state["runs"] == 2 and shown[0] == "full run 2: in a fragment run False, fragment None"
    (fragment_id,) = at._fragment_storage._fragments
    assert f"fragment {fragment_id}: in a fragment run False, others after it False" in shown, moved(
        "ThreadState.get().fragment_id", "this_fragment_id", f"does not name the fragment whose body runs ({shown})")


def test_a_fragment_run_knows_it_is_one_and_which_fragment_runs():
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

    at = AppTest.from_function(_script).run(timeout=30)
    (fragment_id,) = at._fragment_storage._fragments
    rerun_fragment = functools.partial(RerunData, fragment_id_queue=[fragment_id])
    with pytest.MonkeyPatch.context() as mp:  # as a browser asks for it: the fragment alone
        mp.setattr("streamlit.testing.v1.local_script_runner.RerunData", rerun_fragment)
        at.run(timeout=30)
    assert not at.exception, [e.value for e in at.exception]
    assert f"fragment {fragment_id}: in a fragment run True, others after it False" in _texts(at), moved(
        "ScriptRunContext.fragment_ids_this_run / ThreadState", "in_fragment_run, this_fragment_id",
        f"no longer tell a fragment run and its fragment ({_texts(at)})")


def test_a_fragment_gives_way_to_the_fragments_queued_after_it_in_the_same_run():
    assert internals.others_run_after("follow", ["follow", "stop"]), "Stop waits behind the follower: it ends its run"
    assert not internals.others_run_after("follow", ["stop", "follow"]), "Stop already ran: the follower holds"
    assert not internals.others_run_after("follow", ["follow"])
    assert not internals.others_run_after("follow", None)  # a full run
    assert not internals.others_run_after(None, ["stop", "follow"])  # not in a fragment (a full run)


def _asks_for_its_fragment() -> None:
    import streamlit as st

    from agent.ui import streamlit_internals as internals

    runs = st.session_state.setdefault("runs", [])

    @st.fragment
    def part() -> None:
        runs.append("fragment" if internals.in_fragment_run() else "full")
        st.session_state["fragment_id"] = internals.this_fragment_id()

    part()
    if not internals.in_fragment_run():
        st.session_state["asked"] = internals.request_fragment_run(st.session_state["fragment_id"])
        st.text("drawn after the request")  # the request does not cut this run short


def test_a_full_run_asks_for_a_fragments_run_right_after_it_ends():
    """The full run that finds a turn in flight ends (finished: the browser drops what the run before left) and
    asks for the follower's run at once, rather than holding to follow the turn itself."""
    at = AppTest.from_function(_asks_for_its_fragment).run(timeout=30)
    assert not at.exception
    assert at.session_state["asked"], moved("ScriptRequests.request_rerun / RerunData", "request_fragment_run",
                                            "refused a fragment's run asked for from a full run")
    assert "drawn after the request" in _texts(at), moved(
        "ScriptRequests.on_scriptrunner_yield", "request_fragment_run", "now cuts the full run short")
    assert at.session_state["runs"] == ["full", "fragment"], moved(
        "the script runner's loop", "request_fragment_run",
        f"did not run the fragment once the full run ended ({at.session_state['runs']})")


def test_no_other_module_of_the_product_reads_streamlits_internals():
    """One module to adapt when Streamlit changes: nothing else in agent/ (nor app.py) imports streamlit.runtime."""
    root = Path(__file__).resolve().parent.parent
    readers = [str(path.relative_to(root)) for path in [*sorted((root / "agent").rglob("*.py")), root / "app.py"]
               if re.search(r"^\s*(from|import)\s+streamlit\.runtime", path.read_text(), re.MULTILINE)]
    assert readers == [MODULE], readers


def _counts_a_containers_children() -> None:
    import streamlit as st

    from agent.ui import streamlit_internals as internals

    box = st.container()
    with box:
        st.text("one")
        with st.chat_message("user"):  # a block: one child of the box, whatever it holds
            st.text("two")
            st.text("three")
    st.session_state["drawn"] = internals.children_drawn(box)


def test_a_containers_cursor_tells_how_many_children_this_run_drew_in_it():
    """The page draws an empty element over each place of the finished turns that the run before drew and this
    one did not (agent/ui/layout.py), so it must know how many this run drew."""
    at = AppTest.from_function(_counts_a_containers_children).run(timeout=30)
    drawn = at.session_state["drawn"]
    assert drawn == 2, moved("DeltaGenerator._cursor.index", "children_drawn",
                             f"no longer counts a container's children ({drawn})")
    assert internals.children_drawn(object()) is None
