"""The page: wiring of state, sidebar and rendering. Every error ends as readable text, never a traceback.

A full run draws the finished turns once. What changes afterwards lives in `_follow`, an
`st.fragment` that follows the conversation's event stream within its own run: it draws each write
as it arrives (the text being written grows in a placeholder of its own), waiting in slices short
enough that whatever waits is let through at once: a click that reruns the app (a message, the
sidebar) cuts it short, and another fragment's rerun (Stop, a toggle in an earlier turn) goes first,
the follower after it. When a turn starts or ends it asks for
one full run. Its run restarts itself now and then; its streamlit-autorefresh component is the net
that starts it after a full run, or restarts it should a run end otherwise (ticks that come while
it holds only queue one rerun). A fragment rerun never pre-empts a full run (Streamlit queues it),
so nothing can livelock the page.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import streamlit as st
from streamlit.delta_generator import DeltaGenerator
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequestType
from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState
from streamlit_autorefresh import st_autorefresh

from agent.contract import Status
from agent.deadline import TOOL_CUT_SLACK_S
from agent.hosting import services
from agent.hosts import host_allowed
from agent.runtime.connection import is_memory_error, redis_problem
from agent.settings import (
    ALLOWED_HOSTS_VARIABLE,
    DEFAULT_ALLOWED_HOSTS,
    Settings,
    SettingsError,
    allowed_hosts,
)
from agent.ui import conversations as conversations_ui
from agent.ui import render, sidebar, tool_sources
from agent.ui import state as ui
from agent.ui.guard import drawn_or_said
from agent.ui.timeline import timeline_chart
from agent.ui.watch import VersionWatch
from agent.well_formed import UnreadableState, number

log = logging.getLogger(__name__)

# Everything imported so far (Streamlit, Altair, pandas, the product) lives as long as the server: out
# of the collector's reach, a full collection no longer walks it (~150 ms each, with the GIL held).
# This module is imported once per server process (app.py, which Streamlit re-executes, imports it).
gc.freeze()

INPUT_KEY = "chat_input"
REDIS_RETRY_MS = 3000  # milliseconds between retries while Redis does not answer
HANDOFF_KEY = "agent_follow_handoff"  # the state a full run read, handed to the fragment it draws
SHOW_ALL_KEY = "agent_show_all_turns"  # the conversation id whose earlier turns the user asked to see
SLICE_S = 0.05  # seconds the follower waits at a time: a click outside it is answered within this
HOLD_S = 30.0  # seconds one follower run lasts before it restarts itself (a fresh draw, a fresh watch)
STATUS_REDRAW_S = 1.0  # seconds between redraws of the budget bar and the lost-worker check, in flight
IDLE_CHECK_S = 2.0  # seconds between an idle follower's checks that its conversation still exists (one HGET)
IDLE_TICK_MS = 3000  # milliseconds between the idle page's ticks (each a message, not a run, while it holds)
EXAMPLES = (
    "What is 17*23, and what time is it in Tokyo?",
    "How does the deadline work?",
    "Please be slow 5 seconds, then tell me the time in Paris.",
)
LEAD = (
    "You are watching an AI assistant answer with tools, live: each step appears as it happens, and "
    "whatever goes wrong (a model that hangs, a tool that is slow), the reply always comes back in time."
)
HOW_IT_WORKS = (
    "Each message starts a **turn** that runs as a job on a queue, in a worker process, under three clocks: "
    "every model call has its own **timeout**; the turn stops itself at its **deadline**; and the queue kills "
    "the job at its **job timeout**, a margin later. The turn writes its progress after every step, so you "
    "see each tool call as it lands, and it always says how it ended. Try a scenario from the sidebar "
    "(*hang*, *slow tool*) to watch the clocks at work."
)

CLOCK_RULES = f"""\
deadline     = job start + job timeout - margin
call timeout = min(call cap, time left before the deadline)
tool limit   = min(tool cap, time left - minimum call - {TOOL_CUT_SLACK_S:g} s)
no model call starts with less than the minimum call left"""


@st.cache_resource(show_spinner="Starting Redis and the workers…")
def backend(redis_url: str | None, workers: int, state_ttl_s: int) -> ui.Backend:
    # The arguments are the cache key; services.ensure itself is once per process.
    return ui.connect(Settings.from_env())


def main() -> None:
    bound_address = st.get_option("server.address")
    try:
        settings = Settings.from_env(bound_address=bound_address)
    except SettingsError as exc:
        # What is wrong is said only to a page asked for under a name it answers at.
        if _host_allowed(_hosts_despite(bound_address)):
            _fatal("The configuration is not valid", str(exc), "Fix the variable named above and restart the app.")
        return
    if not _host_allowed(settings.allowed_hosts):
        return
    try:
        be = backend(settings.redis_url, settings.workers, settings.state_ttl_s)
    except (services.ServiceError, SettingsError, redis.RedisError, OSError) as exc:
        _fatal("The page could not start its services", str(exc),
               "Check REDIS_URL (or unset it to use the embedded Redis), then reload this page.")
        return
    try:
        _page(settings, be)
    except redis.RedisError as exc:
        log.warning("redis failed during a page run: %s", exc)
        _redis_down(exc)
    except UnreadableState as exc:  # became unreadable after this run found it readable
        log.warning("%s", exc)
        st.error(f"**This conversation cannot be read:** {ui.unreadable_sentence(exc)} Start a new chat.",
                 icon="🛑")
        _new_chat_button()
    except Exception as exc:  # noqa: BLE001 - a page shows a sentence, never a traceback
        log.exception("page run failed")
        st.error(f"Something went wrong while drawing this page ({type(exc).__name__}). Reload to try again, "
                 "or start a new chat.")
        _new_chat_button()


def _new_chat_button() -> None:
    st.button("🗨️ New chat", key="new-chat-after-error", on_click=_new_chat)


def request_host() -> str | None:
    """The Host header of the browser's connection to this page; None without one (AppTest sends none)."""
    return st.context.headers.get("Host")


def _hosts_despite(bound_address: str | None) -> tuple[str, ...]:
    """The names the page answers at while another setting is wrong; the defaults when the list itself is."""
    try:
        return allowed_hosts(os.environ, bound_address)
    except SettingsError:
        return DEFAULT_ALLOWED_HOSTS


def _host_allowed(allowed: tuple[str, ...]) -> bool:
    """Refuse, before any conversation is read, a page asked for under a name it does not answer at:
    a page with no login must not be readable through a name an attacker's DNS points here."""
    if host_allowed(request_host(), allowed):
        return True
    # The requested name is not echoed: it is whatever the caller chose to send.
    st.title("⏱️ Agent demo")
    # Nor are the configured names: a rebound page is readable by whoever rebound it.
    st.error(f"This page answers only at {', '.join(DEFAULT_ALLOWED_HOSTS)} and the names its operator set, "
             f"not at the name in this address. Open it at one of those, or set {ALLOWED_HOSTS_VARIABLE} to "
             "the names you use (comma-separated) and restart the app.", icon="🛑")
    return False


def _fatal(title: str, detail: str, hint: str) -> None:
    st.title("⏱️ Agent demo")
    st.error(f"**{title}.**\n\n{detail}\n\n{hint}", icon="🛑")


def _redis_down(exc: Exception) -> None:
    if is_memory_error(exc):  # it answers, but refuses writes at its memory bound
        st.error(f"**{redis_problem(exc)}.** This page retries every few seconds; nothing stored is lost.",
                 icon="🔌")
    else:
        st.error(f"**Redis is not answering** ({type(exc).__name__}). This page retries every few seconds; "
                 "nothing you sent is lost.", icon="🔌")
    st_autorefresh(interval=REDIS_RETRY_MS, key="redis-retry")


def _page(settings: Settings, be: ui.Backend) -> None:
    session = st.session_state
    conversation, result = ui.open_conversation(st.query_params.get(ui.CID_PARAM), session, be.store,
                                                be.queue_connection, settings.state_ttl_s)
    cid = conversation.id
    state = result.state
    in_flight = state is not None and not state["done"]

    st.title("⏱️ An agent that always finishes")
    st.markdown(LEAD)
    with st.expander("How it works", expanded=state is None):
        st.markdown(HOW_IT_WORKS)
        # Also the page's first code block, collapsed or not: the browser loads its code renderer (a
        # chunk of its own) now, not when a tool step lands, whose boxes showed empty until it came.
        st.code(CLOCK_RULES, language=None)
    if conversation.notice:
        st.query_params.pop(ui.CID_PARAM, None)
        st.info(conversation.notice, icon="🔎")
        st.toast(f"That conversation {conversation.gone}: this is a new chat.", icon="🔎")
    # The conversation's places, in the order they show, filled out of order: Stop first, then the turn
    # in flight, then the rest of the page.
    turns_box, live_box, stop_box = st.container(), st.container(), st.container()
    if in_flight:
        with stop_box:
            _stop_control(settings, be, state)
    # First in the sidebar: a new chat and the conversations to come back to (filled after the input is
    # drawn), then the next turn's settings.
    top = st.sidebar.container()
    st.sidebar.divider()
    settings_box = sidebar.settings_box()
    config, config_error = sidebar.render_sidebar(settings.turn, settings_box)
    tool_sources.render_tool_sources(be.store.redis, settings_box)
    # Streamlit pins the input to the bottom wherever it is called. A run that starts a turn turns it off
    # before it shows the turn; one that ends a turn empties the turn's frame before it turns it back on:
    # the page never shows a turn in flight with the input on.
    if in_flight:
        _chat_input(settings, be, cid, in_flight, config)
    # Then the turn in flight (or, when it has ended, its frame emptied).
    if state is not None:  # a conversation others can reach (its link): follow it, in flight or idle
        session[HANDOFF_KEY] = state
    with live_box:  # a new chat too: its first turn then finds the follower's component already loaded
        live = _follow(settings, be, cid, state["turn_id"] if state is not None else None, in_flight)
    if not in_flight:
        _chat_input(settings, be, cid, in_flight, config)
    top.button("🗨️ New chat", on_click=_new_chat, width="stretch")
    conversations_ui.render_conversations(top, be.store, cid, exists=state is not None,
                                          show_list=settings.show_conversations)
    if state is not None and st.query_params.get(ui.CID_PARAM) != cid:
        st.query_params[ui.CID_PARAM] = cid  # the first message makes the chat a link: reload and tabs follow it
    if result.lost:
        st.toast("The worker running this turn was lost; its ending has been written.", icon="🛑")

    with turns_box:
        if state is None or not state["history"]:
            _empty_chat(settings, be, cid)
        else:
            turns = render.split_turns(state)
            _finished_turns(cid, turns[:-1] if in_flight else turns)

    _flash(session)
    if in_flight:
        st.caption("✋ The input is off while this reply is being written: one turn at a time. "
                   "Press **Stop** to end it early.")
    elif config is None:
        st.caption(f"✋ Fix the settings in the sidebar to send a message: {config_error}")
    if live is not None:  # everything is drawn: follow the turn from here until the follower takes over
        _bridge(settings, be, cid, state, live)


def _chat_input(settings: Settings, be: ui.Backend, cid: str, in_flight: bool, config) -> None:
    st.chat_input(
        "Ask something that needs a tool…" if not in_flight else "Wait for the reply, or press Stop…",
        key=INPUT_KEY,
        disabled=in_flight or config is None,
        on_submit=_on_send,
        args=(settings, be, cid),
    )


@st.fragment
def _stop_control(settings: Settings, be: ui.Backend, state: dict) -> None:
    """Stop, a fragment of its own: its click reruns only this (the follower gives way within SLICE_S),
    so "Stopping…" is drawn by a run that draws nothing else. When the follower runs after it, that
    follows the turn to its end; when it does not (the click cut a full run short), this run does,
    until the follower's tick takes over or the turn ends (one full run)."""
    if st.session_state.get(ui.STOPPING_KEY) != state["turn_id"]:
        st.button("⏹️ Stop", key="stop", on_click=_on_stop, args=(settings, be))
        return
    st.info("**Stopping…** The running step is being stopped; the turn ends in a moment.", icon="⏹️")
    if _in_fragment_run() and not _queued_after_this_fragment():  # else the follower runs next, and follows
        with _said_if_it_fails("followed"):
            _until_moved(be, state, limit_s=2 * settings.poll_interval_ms / 1000)


def _until_moved(be: ui.Backend, state: dict, *, limit_s: float) -> None:
    """Wait, in slices, for the turn to end (then one full run draws it), for at most `limit_s`; any
    other run waiting (the follower's tick, a click) ends the wait at once."""
    cid, session = state["conversation_id"], st.session_state
    watch = VersionWatch(be.store, cid, state["version"])
    try:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            moved = watch.wait(SLICE_S)
            _ = INPUT_KEY in session  # a full run waiting cuts this run here
            if _fragment_rerun_waiting():  # the follower's tick: it follows the turn from here
                return
            if watch.error is not None:
                raise watch.error
            if moved and _turn_moved(ui.poll(be.store, be.queue_connection, session, cid).state,
                                     state["turn_id"], True):
                st.rerun(scope="app")
    except redis.RedisError as exc:
        log.warning("redis failed while waiting for a turn to stop: %s", exc)
    finally:
        watch.close()


def _finished_turns(cid: str, turns: list[dict]) -> None:
    """Drawn once per full run. Past RECENT_TURNS, earlier turns wait behind a button, so a full run
    (the one that ends each turn) costs the same at turn 30 and turn 300."""
    hidden = 0 if st.session_state.get(SHOW_ALL_KEY) == cid else max(0, len(turns) - render.RECENT_TURNS)
    if hidden:
        st.button(f"Show {hidden} earlier turn{'s' * (hidden != 1)}", key="show-earlier",
                  on_click=_show_all, args=(cid,))
    for index, turn in enumerate(turns[hidden:], start=hidden):
        with drawn_or_said(f"turn {index + 1}"):
            render.render_turn(turn, latest=index == len(turns) - 1)


@dataclass
class _Live:
    """The placeholders of the turn in flight, redrawn as writes arrive, each only when it changed."""

    body: DeltaGenerator  # the turn: messages and steps
    text: DeltaGenerator | None  # the text being written, inside the body
    status: DeltaGenerator  # the budget bar and the step running now (its clock moves every second)
    chart: DeltaGenerator  # the timeline, redrawn with the budget bar: its now-line is the bar's now


def _live_places() -> _Live:
    """One frame holds them all, so a full run that finds the turn ended empties it with one element."""
    with st.empty().container():
        return _Live(st.empty(), None, st.empty(), st.empty())


@st.fragment
def _follow(settings: Settings, be: ui.Backend, cid: str, turn_id: str | None, in_flight: bool) -> _Live | None:
    """The turn in flight (or nothing, when the conversation is idle), kept up to date within this run.

    In a full run it draws what the run read. Its streamlit-autorefresh component (one per
    conversation, so the browser keeps the same one) starts a fragment run after a full run; that run
    follows the event stream for up to HOLD_S, drawing each write as it lands, then restarts itself.
    Ticks that come meanwhile only queue one rerun, which restarts a run that ended any other way.
    When a turn starts or ends it asks for one full run, which draws the page around it. In a full run
    it returns the places it drew for a turn in flight, which the run follows once the page is drawn.

    An exception here is not caught by main(): it is said in a sentence, and the following goes on."""
    following: list[bool] = []  # the body appends once it has drawn the autorefresh component
    with _said_if_it_fails("drawn"):
        return _follow_body(settings, be, cid, turn_id, in_flight, following)
    if not following:  # the body failed before its component: the page must keep ticking
        st_autorefresh(interval=settings.poll_interval_ms, key=f"follow-{cid}")
    return None


def _bridge(settings: Settings, be: ui.Backend, cid: str, state: dict, live: _Live) -> None:
    """A full run that found a turn in flight (it started it, or the page was reloaded) follows it once the
    whole page is drawn, so the first words, a step or the ending show at once rather than after the
    follower's first tick. It gives way to that tick (the follower takes over), to any click, and
    to the turn's start or end (one more full run); it lasts at most two ticks."""
    with _said_if_it_fails("followed"):
        _hold(settings, be, cid, state, live, limit_s=2 * settings.poll_interval_ms / 1000)


@contextlib.contextmanager
def _said_if_it_fails(what: str) -> Iterator[None]:
    """Following the turn in flight never ends in a traceback, and is not caught by main(): a state that
    cannot be read goes to a full run (which says so, and offers a new chat); anything else is said in
    a sentence, and the follower goes on."""
    try:
        yield
    except UnreadableState as exc:
        log.warning("%s", exc)
        st.rerun(scope="app")
    except Exception as exc:  # noqa: BLE001 - a sentence, never a traceback
        log.exception("the turn in flight could not be %s", what)
        st.warning(f"The reply being written could not be {what} ({type(exc).__name__}); this page keeps "
                   "looking for it.", icon="⚠️")


def _follow_body(settings: Settings, be: ui.Backend, cid: str, turn_id: str | None, in_flight: bool,
                 following: list[bool]) -> _Live | None:
    session = st.session_state
    if turn_id is None:
        # A new chat: nothing to follow yet, but its component is drawn now, where and under the key its
        # first turn will draw it (the chat's id does not change when the message is sent).
        _follow_component(settings, cid, in_flight=False, following=following)
        return None
    state = session.pop(HANDOFF_KEY, None)
    full_run = state is not None
    if not full_run:
        try:
            state = ui.poll(be.store, be.queue_connection, session, cid).state
        except redis.RedisError as exc:
            log.warning("redis failed during a poll: %s", exc)
            _redis_down(exc)
            return None
        if _turn_moved(state, turn_id, in_flight):
            st.rerun(scope="app")
    _follow_component(settings, cid, in_flight=in_flight, following=following)
    live = None
    if not in_flight:
        st.empty()  # in place of the frame of a turn that was in flight: it goes at once, not at the run's end
    else:
        live = _live_places()
        _draw_turn(live, state)
        _draw_status(settings, be, live, state)
    if full_run:  # the run follows the turn in flight once it has drawn the rest of the page (_bridge)
        return live
    if _hold(settings, be, cid, state, live, limit_s=HOLD_S):
        st.rerun(scope="fragment")  # a fresh run: a fresh draw, a fresh watch
    return None


def _follow_component(settings: Settings, cid: str, *, in_flight: bool, following: list[bool]) -> None:
    """The streamlit-autorefresh component, first in the fragment in every run (a new chat, idle, in
    flight), under one key per conversation: the browser keeps the same frame, instead of loading a new
    one (seconds, on a busy machine) just when a turn starts. A tick costs no run while the follower
    holds (Streamlit queues it behind the run), so the interval is only how soon a follower starts
    after a full run: short in flight, longer idle."""
    st_autorefresh(interval=settings.poll_interval_ms if in_flight else IDLE_TICK_MS, key=f"follow-{cid}")
    following.append(True)


def _turn_moved(state: dict | None, turn_id: str, in_flight: bool) -> bool:
    """A turn started or ended since the full run: only a full run draws the page around it."""
    return state is None or state["turn_id"] != turn_id or state["done"] == in_flight


def _hold(settings: Settings, be: ui.Backend, cid: str, state: dict, live: _Live | None, *, limit_s: float) -> bool:
    """Follow the event stream for up to `limit_s` (then True): each write is drawn as it lands, and
    every SLICE_S the run gives way to whatever else waits. A click outside cuts it. Another fragment's
    rerun goes first: a fragment run asks to run again after it; a full run simply ends (the follower
    takes over). False when it gave way or Redis failed (said on the page, which retries)."""
    session = st.session_state
    watch = VersionWatch(be.store, cid, state["version"])
    try:
        end = time.monotonic() + limit_s
        next_status = time.monotonic() + STATUS_REDRAW_S
        while time.monotonic() < end:
            moved = watch.wait(SLICE_S)
            if _give_way():
                return False
            if watch.error is not None:
                raise watch.error
            # In flight: the budget bar's clock and the lost-worker check. Idle: whether the conversation
            # is still there (an expired or deleted one writes nothing to wake the watch).
            stale = time.monotonic() >= next_status
            if not moved and not stale:
                continue
            # No wait here: the watch already waited. Unchanged, this is the lost-worker check.
            fresh = ui.poll(be.store, be.queue_connection, session, cid).state
            if _turn_moved(fresh, state["turn_id"], live is not None):
                st.rerun(scope="app")
            if live is None:
                state = fresh
                next_status = time.monotonic() + IDLE_CHECK_S
                continue
            text_only = ui.text_only_change(state, fresh)
            if fresh["version"] != state["version"]:
                if text_only and live.text is not None:
                    render.render_live_text(live.text, render.live_text(fresh))
                else:
                    _draw_turn(live, fresh)
            state = fresh
            if stale or not text_only:
                _draw_status(settings, be, live, state)
                next_status = time.monotonic() + STATUS_REDRAW_S
    except redis.RedisError as exc:
        log.warning("redis failed while following a conversation: %s", exc)
        _redis_down(exc)
        return False
    finally:
        watch.close()
    return True


def _give_way() -> bool:
    """A yield point: a full run waiting (a click outside) cuts this run here. Another fragment waiting
    (Stop, a toggle in an earlier turn, the follower's tick) is let through: a fragment run asks to run
    again after it; a full run is told to end (True). A fragment queued after this one in the same run
    is let through by ending this run (True): the follower's next tick restarts it."""
    _ = INPUT_KEY in st.session_state  # reading session state is where Streamlit honours a waiting rerun
    if _queued_after_this_fragment():
        return True
    if not _fragment_rerun_waiting():
        return False
    if _in_fragment_run():
        st.rerun(scope="fragment")
    return True


def _in_fragment_run() -> bool:
    return bool(getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


def waiting_fragment_ids(requests) -> list[str]:
    """The fragments whose reruns wait for the running one to end. Streamlit has no public way to ask, so
    this reads its request queue (tests/test_app.py checks it against Streamlit's own ScriptRequests); if
    that ever changes, it says none wait, and a follower's run simply lasts HOLD_S."""
    if getattr(requests, "_state", None) != ScriptRequestType.RERUN:
        return []
    return list(getattr(getattr(requests, "_rerun_data", None), "fragment_id_queue", None) or [])


def _this_fragment_id() -> str | None:
    try:
        return ThreadState.get().fragment_id
    except (RuntimeError, AttributeError):  # no script run here, or Streamlit's internals moved
        return None


def _fragment_rerun_waiting() -> bool:
    """Another fragment's rerun waits (this fragment's own ticks only queue its next run, which can wait)."""
    ctx = get_script_run_ctx()
    this = _this_fragment_id()
    return any(fragment_id != this for fragment_id in waiting_fragment_ids(getattr(ctx, "script_requests", None)))


def _queued_after_this_fragment() -> bool:
    """This run goes on to other fragments once this one returns (Stop clicked just as the follower's tick came)."""
    return others_run_after(_this_fragment_id(), getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


def others_run_after(this: str | None, fragment_ids_this_run) -> bool:
    """Whether the run's queue of fragments goes on past `this` one (they run in the queue's order)."""
    queued = list(fragment_ids_this_run or ())
    return this in queued and queued.index(this) < len(queued) - 1


def _draw_turn(live: _Live, state: dict) -> None:
    with live.body.container():
        live.text = render.render_turn(render.current_turn(state), latest=True)


def _draw_status(settings: Settings, be: ui.Backend, live: _Live, state: dict) -> None:
    """The budget bar and, once the turn has a step that ended, the timeline, drawn together from one
    reading of the clock: the chart's now-line and running bar are the same instant as the bar's
    "used" (a chart drawn only when a step started or ended froze its now while a call hung). No chart
    before a step has ended: a first chart loads Vega (about 0.8 MB of script), and drawing it held the
    browser's main thread for 0.2-1 s just as the first call's first words arrived, which then showed
    half a second late. A running first call is said by the status line above it."""
    now = ui.now()
    turn = render.current_turn(state)
    with live.status.container():
        _in_flight(settings, be, state, now)
    if state["status"] != Status.QUEUED and turn.steps:  # steps are recorded when they end
        figure = timeline_chart(turn.steps, turn.summary, now=now, current=state.get("current_step"))
        if figure is not None:
            live.chart.vega_lite_chart(figure, width="stretch")


def _empty_chat(settings: Settings, be: ui.Backend, cid: str) -> None:
    st.markdown("##### Try one of these")
    for index, example in enumerate(EXAMPLES):
        st.button(example, key=f"example-{index}", on_click=_send_text, args=(settings, be, cid, example))


def _in_flight(settings: Settings, be: ui.Backend, state: dict, now: float) -> None:
    config = state.get("config") or {}
    safeguards_off = config.get("safeguards") is False
    with st.container(border=True):
        if state["status"] == Status.QUEUED:
            info = ui.queue_info(be, state)
            if info.job_status == "started" and safeguards_off:
                # Safeguards off: the job runs but writes nothing until it ends.
                timeout = number(config.get("job_timeout_s"))
                st.markdown(f"**A worker is running this turn with safeguards off.** It writes nothing until it "
                            f"ends, so there is nothing to show yet. The queue kills it {timeout} s after it "
                            f"started at the latest, and this page will say so.")
                waited = now - (state.get("enqueued_at") or now)
                if timeout:
                    st.progress(min(1.0, waited / timeout),
                                text=f"{waited:.0f} s since it was sent, of the {timeout} s job timeout")
            elif info.job_status == "started":
                st.markdown(f"**{render.STATUS_LABELS['running']}** · a worker has picked this turn up")
            else:
                place = f"place **{info.position}** in the queue" if info.position else "about to start"
                st.markdown(f"**{render.STATUS_LABELS['queued']}**: {place} · **{info.workers}** worker"
                            f"{'s' * (info.workers != 1)}, {info.busy} busy")
                if info.workers == 0:
                    st.warning("No worker is running. Start one with `python worker.py` "
                               "(this app runs with AGENT_WORKERS=0).")
        else:
            fill, text = render.budget_text(state, now)
            st.progress(fill, text=f"⏱️ {text}")
            current = render.current_step_text(state.get("current_step"), now)
            st.markdown(f"**{render.STATUS_LABELS['running']}** · {current or 'writing the result'}")


# -- callbacks (they run before the next script run, so the page draws their outcome at once) --------


def _on_send(settings: Settings, be: ui.Backend, cid: str) -> None:
    _send_text(settings, be, cid, st.session_state.get(INPUT_KEY))


def _send_text(settings: Settings, be: ui.Backend, cid: str, text: str | None) -> None:
    try:
        config, error = sidebar.next_turn_config(settings.turn), None
    except SettingsError as exc:
        config, error = None, str(exc)
    try:
        ui.send(be.store, be.queue, st.session_state, cid, text, config, error)
    except redis.RedisError as exc:
        why = redis_problem(exc) if is_memory_error(exc) else f"Redis is not answering ({type(exc).__name__})"
        st.session_state[ui.FLASH_KEY] = ("error", f"Not sent: {why}.", text)


def _on_stop(settings: Settings, be: ui.Backend) -> None:
    view = st.session_state.get(ui.VIEW_KEY)
    if view and not view["state"]["done"]:
        try:
            ui.stop(be.store, st.session_state, view["state"], settings.state_ttl_s, be.queue_connection)
        except redis.RedisError as exc:
            st.session_state[ui.FLASH_KEY] = ("error", f"Could not ask the turn to stop ({type(exc).__name__}).",
                                              None)


def _new_chat() -> None:
    ui.new_chat(st.session_state)
    st.session_state.pop(SHOW_ALL_KEY, None)
    st.query_params.pop(ui.CID_PARAM, None)


def _show_all(cid: str) -> None:
    st.session_state[SHOW_ALL_KEY] = cid


def _dismiss_flash() -> None:
    st.session_state.pop(ui.FLASH_KEY, None)


def _flash(session) -> None:
    """A refusal (or a note on what just happened) stays, with the unsent text, until it is dismissed or
    a message is sent."""
    flash = session.get(ui.FLASH_KEY)
    if not flash:
        return
    kind, text, unsent = flash
    with st.container(border=True):
        alert, icon = {"info": (st.info, "ℹ️"), "warning": (st.warning, "✋")}.get(kind, (st.error, "✋"))
        alert(text, icon=icon)
        if unsent and unsent.strip():
            st.caption("Your message, not sent (copy it from here):")
            st.code(unsent, language=None, wrap_lines=True)
        st.button("Dismiss", key="dismiss-flash", on_click=_dismiss_flash)
