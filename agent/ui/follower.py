"""The turn in flight, followed live: the follower fragment, its status panel, and Stop.

A full run draws the finished turns once (agent/ui/layout.py). What changes afterwards lives in
`follow`, an `st.fragment` that follows the conversation's event stream within its own run: it draws
each write as it arrives (the text being written grows in a placeholder of its own), waiting in slices
short enough that whatever waits is let through at once: a click that reruns the app (a message, the
sidebar) cuts it short, and another fragment's rerun (Stop, a toggle in an earlier turn) goes first,
the follower after it. When a turn starts or ends it asks for one full run, which asks for the
follower's next run as it ends. A follower run ends now and then, and its streamlit-autorefresh
component starts the next (ticks that come while it holds only queue one rerun); it is also the net
that restarts it should a run end otherwise. A fragment rerun never pre-empts a full run (Streamlit
queues it), so nothing can livelock the page.

Stale elements: the browser keeps every element of the run before that a run has not drawn over, marked
stale (faded), until a run *finishes*; a run cut short for a rerun (st.rerun) does not. So a full run
never holds (it finishes, then the follower follows), every follower run draws the same shape before
it holds, and one that has followed long enough simply ends; it reruns only into a full run, or to let
another fragment go first.
What waits is read from Streamlit's script runner, and the follower's next run is asked of it, through
agent/ui/streamlit_internals.py alone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import streamlit as st
from streamlit.delta_generator import DeltaGenerator
from streamlit_autorefresh import st_autorefresh

from agent.contract import Status
from agent.conversation.turns import current_turn, live_text
from agent.conversation.well_formed import UnreadableState, number
from agent.conversation.words import STATUS_LABELS
from agent.settings import Settings
from agent.turn.heartbeat import HEARTBEAT_S, HEARTBEAT_TTL_S
from agent.ui import actions, approval, render
from agent.ui import state as ui
from agent.ui.callbacks import on_stop
from agent.ui.guard import redis_down
from agent.ui.streamlit_internals import (
    fragment_rerun_waiting,
    in_fragment_run,
    queued_after_this_fragment,
    request_fragment_run,
    this_fragment_id,
    yield_to_waiting_reruns,
)
from agent.ui.timeline import timeline_chart
from agent.ui.watch import VersionWatch

log = logging.getLogger(__name__)

HANDOFF_KEY = "agent_follow_handoff"  # the state a full run read, handed to the fragment it draws
FOLLOWER_ID_KEY = "agent_follower_id"  # the follower's fragment id, noted by the full run that draws it
AT_ONCE_KEY = "agent_follow_at_once"  # seconds the run a full run asked for holds (follow_at_once)
SLICE_S = 0.05  # seconds the follower waits at a time: a click outside it is answered within this
HOLD_S = 30.0  # seconds one follower run lasts; then it ends, and the tick queued meanwhile starts a fresh one
STATUS_REDRAW_S = 1.0  # seconds between redraws of the budget bar and the lost-worker check, in flight
IDLE_CHECK_S = 2.0  # seconds between an idle follower's checks that its conversation still exists (one HGET)
IDLE_TICK_MS = 3000  # milliseconds between the idle page's ticks (each a message, not a run, while it holds)


@st.fragment
def stop_control(settings: Settings, be: ui.Backend, state: dict) -> None:
    """Stop, a fragment of its own: its click reruns only this (the follower gives way within SLICE_S),
    so "Stopping…" is drawn by a run that draws nothing else. When the follower runs after it, that
    follows the turn to its end; when it does not (the click cut a full run short), this run does,
    until the follower's tick takes over or the turn ends (one full run)."""
    if st.session_state.get(ui.STOPPING_KEY) != state["turn_id"]:
        st.button("⏹️ Stop", key="stop", on_click=on_stop, args=(settings, be))
        return
    st.info("**Stopping…** The running step is being stopped; the turn ends in a moment.", icon="⏹️")
    if in_fragment_run() and not queued_after_this_fragment():  # else the follower runs next, and follows
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
            yield_to_waiting_reruns()  # a full run waiting cuts this run here
            if fragment_rerun_waiting():  # the follower's tick: it follows the turn from here
                return
            if watch.error is not None:
                raise watch.error
            if moved and _turn_moved(ui.poll(be.store, be.queue_connection, session, cid).state,
                                     state["turn_id"], ui.phase_of(state)):
                st.rerun(scope="app")
    except redis.RedisError as exc:
        log.warning("redis failed while waiting for a turn to stop: %s", exc)
    finally:
        watch.close()


@dataclass
class Live:
    """The placeholders of the turn in flight, redrawn as writes arrive, each only when it changed."""

    body: DeltaGenerator  # the turn: messages and steps
    text: DeltaGenerator | None  # the text being written, inside the body
    status: DeltaGenerator  # the budget bar and the step running now (its clock moves every second)
    chart: DeltaGenerator  # the timeline, redrawn with the budget bar: its now-line is the bar's now


def _live_places() -> Live:
    """One frame holds them all, so a full run that finds the turn ended empties it with one element.
    Its three places are drawn in every phase (live or parked), so no run leaves one of an earlier run's
    behind it (see `_follow_body`)."""
    with st.empty().container():
        return Live(st.empty(), None, st.empty(), st.empty())


@st.fragment
def follow(settings: Settings, be: ui.Backend, cid: str, turn_id: str | None, phase: str) -> None:
    """The turn in flight (or nothing, when the conversation is idle), kept up to date within this run.

    `phase` is the conversation's as the full run saw it (ui.phase_of). A parked turn (a tool waits for
    a person) is followed as an idle one is: drawn once by the full run, then one blocking wait on the
    event stream, so the answer (from any tab, the command line, or the expiry) wakes it at once.

    In a full run it draws what the run read. Its streamlit-autorefresh component (one per
    conversation, so the browser keeps the same one) starts a fragment run after a full run; that run
    follows the event stream for up to HOLD_S, drawing each write as it lands, then ends. Ticks that come
    meanwhile only queue one rerun, which starts the next run as soon as this one ends.
    When a turn starts or ends it asks for one full run, which draws the page around it. A full run that
    finds a turn in flight asks for the follower's next run once the page is drawn (follow_at_once).

    An exception here is not caught by main(): it is said in a sentence, and the following goes on."""
    following: list[bool] = []  # the body appends once it has drawn the autorefresh component
    with _said_if_it_fails("drawn"):
        _follow_body(settings, be, cid, turn_id, phase, following)
        return
    if not following:  # the body failed before its component: the page must keep ticking
        st_autorefresh(interval=settings.poll_interval_ms, key=f"follow-{cid}")


def follow_at_once(settings: Settings, phase: str) -> None:
    """Called last by a full run that found a turn in flight (it started it, or the page was reloaded): the
    follower's next run starts as soon as this run ends, rather than at its first tick, so the first words, a
    step or the ending show at once. This run does not hold: a run that holds keeps every element of the run
    before it that it did not draw over (a finished turn's place, the examples of a new chat, a turn that moved
    from the chat into the follower's frame) marked stale, faded, for as long as it holds; a run that ends drops
    them. That first follower run lasts until the follower's first tick would have come (two in flight, an idle
    one and one more when parked), then ends; the tick, queued meanwhile, starts the next."""
    session = st.session_state
    fragment_id = session.get(FOLLOWER_ID_KEY)
    if request_fragment_run(fragment_id):
        ticks_ms = 2 * settings.poll_interval_ms if phase == ui.LIVE else IDLE_TICK_MS + settings.poll_interval_ms
        session[AT_ONCE_KEY] = ticks_ms / 1000


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


def _follow_body(settings: Settings, be: ui.Backend, cid: str, turn_id: str | None, phase: str,
                 following: list[bool]) -> None:
    session = st.session_state
    if turn_id is None:
        # A new chat: nothing to follow yet, but its component is drawn now, where and under the key its
        # first turn will draw it (the chat's id does not change when the message is sent).
        _follow_component(settings, cid, in_flight=False, following=following)
        st.empty()  # the turn's place, as in every run
        return
    state = session.pop(HANDOFF_KEY, None)
    full_run = state is not None
    if full_run:
        session[FOLLOWER_ID_KEY] = this_fragment_id()
        session.pop(AT_ONCE_KEY, None)
    if not full_run:
        try:
            state = ui.poll(be.store, be.queue_connection, session, cid).state
        except redis.RedisError as exc:
            log.warning("redis failed during a poll: %s", exc)
            redis_down(exc)
            return
        if _turn_moved(state, turn_id, phase):
            st.rerun(scope="app")
    _follow_component(settings, cid, in_flight=phase == ui.LIVE, following=following)
    live = None
    # Every run draws the same shape: the component, the preload's place, then the turn's frame (a frame of
    # three places in flight or parked, one empty element idle). A run that holds keeps every element of the
    # run before it that it has not drawn over marked stale (faded) until it ends: an element drawn one place
    # further down by one run (the preload, once) was a frozen second copy of the turn under the live one.
    if phase == ui.PARKED:  # drawn once: nothing of a parked turn moves until it is answered
        # In the frame of a turn in flight, each of its places replaced at once: a run that holds would
        # otherwise leave the running turn's status box on screen until it ends.
        places = _live_places()
        places.body.empty()
        with places.status.container():
            approval.parked_status(state, read_only=not be.store.owns(state))
        places.chart.empty()
    elif phase == ui.IDLE:
        st.empty()  # in place of the frame of a turn that was in flight: it goes at once, not at the run's end
    else:
        live = _live_places()
        _draw_turn(live, state)
        _draw_status(settings, be, live, state)
    if full_run:  # the full run asks for the follower's next run once it has drawn the page (follow_at_once)
        return
    # After HOLD_S the run simply ends: the tick that came meanwhile (queued behind it) starts the next one at
    # once, with a fresh draw and a fresh watch. Not st.rerun: a run cut short for a rerun is not finished, so
    # the browser keeps whatever it left marked stale, run after run, until the turn ends; a run that ends
    # drops it.
    _hold(settings, be, cid, state, live, phase=phase, limit_s=session.pop(AT_ONCE_KEY, None) or HOLD_S)


PRELOAD_KEY = "renderers-preload"  # its container's CSS class is st-key-renderers-preload
PRELOADED_KEY = "renderers_preloaded"  # session flag: this session's browser has loaded the code renderer


PRELOAD_CSS = f"<style>.st-key-{PRELOAD_KEY} {{display: none}}</style>"


def preload_renderers() -> None:
    """A hidden code block, drawn by the follower's first fragment run of a session (a new chat's first
    idle tick, after the first screen): the browser loads its code renderer (a chunk of its own) then,
    before a tool step's Arguments and Result boxes need it, instead of showing them empty until it
    comes; and the first screen does not wait for it. A full run draws none.

    Its place is drawn by every run, an empty element when there is nothing to preload, so what the
    follower draws after it is at the same place in every run. Its style is inside it (a style-only
    st.html goes to the page's event container, where no later run would draw over it)."""
    session = st.session_state
    place = st.empty()
    if session.get(PRELOADED_KEY) or not in_fragment_run():
        return
    session[PRELOADED_KEY] = True
    with place.container(key=PRELOAD_KEY):
        st.markdown(PRELOAD_CSS, unsafe_allow_html=True)
        st.code("{}", language="json")


def _follow_component(settings: Settings, cid: str, *, in_flight: bool, following: list[bool]) -> None:
    """The streamlit-autorefresh component, first in the fragment in every run (a new chat, idle, in
    flight), under one key per conversation: the browser keeps the same frame, instead of loading a new
    one (seconds, on a busy machine) just when a turn starts. A tick costs no run while the follower
    holds (Streamlit queues it behind the run), so the interval is only how soon a follower starts
    after a full run: short in flight, longer idle."""
    st_autorefresh(interval=settings.poll_interval_ms if in_flight else IDLE_TICK_MS, key=f"follow-{cid}")
    following.append(True)
    preload_renderers()  # once a session, in its first fragment run


def _turn_moved(state: dict | None, turn_id: str, phase: str) -> bool:
    """A turn started, parked, was answered or ended since the full run: only a full run draws the page
    around it."""
    return state is None or state["turn_id"] != turn_id or ui.phase_of(state) != phase


def _hold(settings: Settings, be: ui.Backend, cid: str, state: dict, live: Live | None, *, phase: str,
          limit_s: float) -> bool:
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
            if _turn_moved(fresh, state["turn_id"], phase):
                st.rerun(scope="app")
            if live is None:
                state = fresh
                next_status = time.monotonic() + IDLE_CHECK_S
                continue
            text_only = ui.text_only_change(state, fresh)
            if fresh["version"] != state["version"]:
                if text_only and live.text is not None:
                    render.render_live_text(live.text, live_text(fresh))
                else:
                    _draw_turn(live, fresh)
            state = fresh
            if stale or not text_only:
                look_again_s = _draw_status(settings, be, live, state)
                next_status = time.monotonic() + min(STATUS_REDRAW_S, look_again_s or STATUS_REDRAW_S)
    except redis.RedisError as exc:
        log.warning("redis failed while following a conversation: %s", exc)
        redis_down(exc)
        return False
    finally:
        watch.close()
    return True


def _give_way() -> bool:
    """A yield point: a full run waiting (a click outside) cuts this run here. Another fragment waiting
    (Stop, a toggle in an earlier turn, the follower's tick) is let through: a fragment run asks to run
    again after it; a full run is told to end (True). A fragment queued after this one in the same run
    is let through by ending this run (True): the follower's next tick restarts it."""
    yield_to_waiting_reruns()
    if queued_after_this_fragment():
        return True
    if not fragment_rerun_waiting():
        return False
    if in_fragment_run():
        st.rerun(scope="fragment")
    return True


def _draw_turn(live: Live, state: dict) -> None:
    with live.body.container():
        turn = current_turn(state)
        live.text = render.render_turn(turn, latest=True, branch=actions.in_flight_picker(turn, state))


def _draw_status(settings: Settings, be: ui.Backend, live: Live, state: dict) -> float | None:
    """The budget bar and, once the turn has a step that ended, the timeline, drawn together from one
    reading of the clock: the chart's now-line and running bar are the same instant as the bar's
    "used" (a chart drawn only when a step started or ended froze its now while a call hung). No chart
    before a step has ended: a first chart loads Vega (about 0.8 MB of script), and drawing it held the
    browser's main thread for 0.2-1 s just as the first call's first words arrived, which then showed
    half a second late. A running first call is said by the status line above it. Returns in how many
    seconds to draw them again, when sooner than STATUS_REDRAW_S (see worker_silent)."""
    now = ui.now()
    turn = current_turn(state)
    with live.status.container():
        look_again_s = _in_flight(settings, be, state, now)
    if state["status"] != Status.QUEUED and turn.steps:  # steps are recorded when they end
        figure = timeline_chart(turn.steps, turn.summary, now=now, current=state.get("current_step"))
        if figure is not None:
            live.chart.vega_lite_chart(figure, width="stretch")
    return look_again_s


def _in_flight(settings: Settings, be: ui.Backend, state: dict, now: float) -> float | None:
    """The status panel; returns in how many seconds to redraw it, when sooner than STATUS_REDRAW_S."""
    config = state.get("config") or {}
    safeguards_off = config.get("safeguards") is False
    if state["status"] == Status.AWAITING_APPROVAL:  # no job runs: no bar, no queue place, no spinner
        approval.parked_status(state, read_only=not be.store.owns(state))
        return None
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
                st.markdown(f"**{STATUS_LABELS['running']}** · a worker has picked this turn up")
            elif info.job_status == "rate_limited":
                st.markdown(f"**{STATUS_LABELS['queued']}** behind your own turns: one person's turns take at most "
                            f"{be.share} worker{'s' * (be.share != 1)} at a time, so that everyone gets theirs. "
                            "It joins the queue as soon as one of yours ends.")
            else:
                place = f"place **{info.position}** in the queue" if info.position else "about to start"
                st.markdown(f"**{STATUS_LABELS['queued']}**: {place} · **{info.workers}** worker"
                            f"{'s' * (info.workers != 1)}, {info.busy} busy")
                if info.workers == 0:
                    st.warning(no_worker_text(settings.workers))
        else:
            fill, text = render.budget_text(state, now)
            st.progress(fill, text=f"⏱️ {text}")
            if (bar := render.money_bar(state)) is not None:  # the fourth clock, beside the time
                st.progress(bar[0], text=f"💵 {bar[1]}")
            silent, look_again_s = worker_silent(be, state)
            if silent:  # no more counting of a step that nobody runs any more
                st.markdown(WORKER_SILENT)
                st.caption(WORKER_SILENT_NOTE)
                return None
            current = render.current_step_text(state.get("current_step"), now)
            st.markdown(f"**{STATUS_LABELS['running']}** · {current or 'writing the result'}")
            return look_again_s
    return None


WORKER_SILENT = "🔄 **The worker stopped answering**; resuming the turn on another worker…"
WORKER_SILENT_NOTE = ("Its heartbeat stopped: the worker running this turn was killed, or is stuck. The turn goes "
                      "on from its last saved step, on its own clocks, as soon as another worker takes it.")
# Milliseconds a silent worker's heartbeat mark has left when the page says so: two beats missed (it is renewed
# every HEARTBEAT_S to HEARTBEAT_TTL_S), a second before it lapses and the pool's watch resumes the turn.
SILENT_LEFT_MS = int((HEARTBEAT_TTL_S - 2 * HEARTBEAT_S) * 1000)


def worker_silent(be: ui.Backend, state: dict) -> tuple[bool, float | None]:
    """Whether the running turn's worker stopped answering, and in how many seconds to look again if sooner
    than the next redraw (the moment it would count as silent).

    Silent: its heartbeat (agent/turn/heartbeat.py, renewed every HEARTBEAT_S by the job running it) missed
    two beats or lapsed, or names another job (the pool's watch handed the turn to a new job, which has not
    written yet), and nothing was written since this state. One round trip a redraw of the status panel; the
    version read only once it looks silent, since a turn that has just ended drops its mark right after its
    last write."""
    if state["status"] != Status.RUNNING or state["done"]:
        return False, None
    beating, left_ms = be.store.flags.alive_mark(state["turn_id"])
    if beating == state["job_id"] and left_ms > SILENT_LEFT_MS:
        return False, (left_ms - SILENT_LEFT_MS) / 1000
    return be.store.version(state["conversation_id"]) == state["version"], None


def no_worker_text(own_workers: int) -> str:
    """What the page says while no worker is running: its own pool is being started again, or it has none."""
    if own_workers > 0:
        return ("No worker is running: this app's workers stopped, and it is starting them again. This turn "
                "starts as soon as one is up.")
    return "No worker is running. Start one with `python worker.py` (this app runs with AGENT_WORKERS=0)."
