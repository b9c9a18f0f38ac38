"""The page: wiring of state, sidebar and rendering. Every error ends as readable text, never a traceback.

A full run draws the finished turns once. While a turn is in flight, only `_live_turn` (an
`st.fragment` holding that turn and the polling component) reruns on each tick, so a poll costs the
same at turn 1 and turn 100. A fragment rerun never pre-empts a full run (Streamlit queues it), so a
tick cannot cut a run short and livelock the page; the fragment asks for one full run when the turn
ends, which redraws the finished turn and re-enables the input.
"""

from __future__ import annotations

import logging
import os
import time

import redis
import streamlit as st
from streamlit_autorefresh import st_autorefresh

from agent.contract import Status
from agent.hosting import services
from agent.hosts import host_allowed
from agent.runtime.connection import is_memory_error, redis_problem
from agent.settings import (
    ALLOWED_HOSTS_VARIABLE,
    DEFAULT_ALLOWED_HOSTS,
    MIN_POLL_INTERVAL_MS,
    Settings,
    SettingsError,
    allowed_hosts,
)
from agent.ui import conversations as conversations_ui
from agent.ui import render, sidebar, tool_sources
from agent.ui import state as ui
from agent.ui.guard import drawn_or_said
from agent.ui.timeline import timeline_chart
from agent.well_formed import UnreadableState, number

log = logging.getLogger(__name__)

INPUT_KEY = "chat_input"
REDIS_RETRY_MS = 3000  # milliseconds between retries while Redis does not answer
HANDOFF_KEY = "agent_live_handoff"  # the state a full run read, handed to the fragment it draws
TICK_COST_KEY = "agent_tick_cost_s"  # how long the last fragment run took, for the adaptive interval
LISTEN_MIN_MS = 50  # milliseconds: a shorter rest of a tick's wait is not worth a blocking read
SHOW_ALL_KEY = "agent_show_all_turns"  # the conversation id whose earlier turns the user asked to see
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

    # First in the sidebar: a new chat and the conversations to come back to (filled after the input is
    # drawn), then the next turn's settings.
    top = st.sidebar.container()
    st.sidebar.divider()
    config, config_error = sidebar.render_sidebar(settings.turn)
    tool_sources.render_tool_sources(be.store.redis)
    # The input is drawn early (Streamlit pins it to the bottom wherever it is called), so a run that
    # starts a turn disables it at once, not after the whole conversation has been drawn.
    st.chat_input(
        "Ask something that needs a tool…" if not in_flight else "Wait for the reply, or press Stop…",
        key=INPUT_KEY,
        disabled=in_flight or config is None,
        on_submit=_on_send,
        args=(settings, be, cid),
    )
    top.button("🗨️ New chat", on_click=_new_chat, width="stretch")
    conversations_ui.render_conversations(top, be.store, cid, exists=state is not None,
                                          show_list=settings.show_conversations)

    st.title("⏱️ An agent that always finishes")
    st.markdown(LEAD)
    with st.expander("How it works", expanded=state is None):
        st.markdown(HOW_IT_WORKS)
    if conversation.notice:
        st.query_params.pop(ui.CID_PARAM, None)
        st.info(conversation.notice, icon="🔎")
        st.toast("That conversation " + ("cannot be read" if conversation.unreadable else "was not found")
                 + ": this is a new chat.", icon="🔎")
    if state is not None and st.query_params.get(ui.CID_PARAM) != cid:
        st.query_params[ui.CID_PARAM] = cid  # the first message makes the chat a link: reload and tabs follow it
    if result.lost:
        st.toast("The worker running this turn was lost; its ending has been written.", icon="🛑")

    if state is None or not state["history"]:
        _empty_chat(settings, be, cid)
    else:
        turns = render.split_turns(state)
        finished = turns[:-1] if in_flight else turns
        _finished_turns(cid, finished)
        if in_flight:
            session[HANDOFF_KEY] = state
            _live_turn(settings, be, cid, state["turn_id"])

    _flash(session)
    if in_flight:
        st.caption("✋ The input is off while this reply is being written: one turn at a time. "
                   "Press **Stop** to end it early.")
    elif config is None:
        st.caption(f"✋ Fix the settings in the sidebar to send a message: {config_error}")


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


@st.fragment
def _live_turn(settings: Settings, be: ui.Backend, cid: str, turn_id: str) -> None:
    """The turn in flight and the polling component: the only part a tick reruns.

    An exception here is not caught by main(): it is said in a sentence, and the polling goes on."""
    polling: list[bool] = []  # the body appends once it has drawn the poller
    try:
        _live_turn_body(settings, be, cid, turn_id, polling)
    except UnreadableState as exc:
        log.warning("%s", exc)
        st.rerun(scope="app")  # the full run says so, and offers a new chat
    except Exception as exc:  # noqa: BLE001 - a sentence, never a traceback, and the polling goes on
        log.exception("the turn in flight could not be drawn")
        st.warning(f"The reply being written could not be drawn ({type(exc).__name__}); this page keeps "
                   "looking for it.", icon="⚠️")
        if not polling:
            st_autorefresh(interval=settings.poll_interval_ms, key=f"poll-{cid}")


def _live_turn_body(settings: Settings, be: ui.Backend, cid: str, turn_id: str, polling: list[bool]) -> None:
    session = st.session_state
    state = session.pop(HANDOFF_KEY, None)
    first = state is not None and state.get("turn_id") == turn_id  # drawn by a full run, not by a tick
    wait_ms = ui.poll_wait_ms(settings.poll_interval_ms)
    listen_until = time.monotonic() + wait_ms / 1000
    if not first:  # a tick: this run is the fragment alone
        try:
            state = ui.poll(be.store, be.queue_connection, session, cid, wait_ms=wait_ms).state
        except redis.RedisError as exc:
            log.warning("redis failed during a poll: %s", exc)
            _redis_down(exc)
            return
        if state is None or state["done"] or state["turn_id"] != turn_id:
            # One full run draws the ending, drops this fragment (and its poller) and re-enables the input.
            st.rerun(scope="app")
    started = time.perf_counter()  # after the poll: its wait for the next write is idle time, not cost
    with drawn_or_said("the reply being written"):  # the poller below is drawn whatever happens here
        turn = render.current_turn(state)
        render.render_turn(turn, latest=True)
        _in_flight(settings, be, state, turn)
    # The first tick comes at once and waits on the event stream for the next write, so an ending
    # that lands right after a full run is not left unseen for a whole interval.
    interval_ms = MIN_POLL_INTERVAL_MS if first else ui.adaptive_interval_ms(settings.poll_interval_ms,
                                                                              session.get(TICK_COST_KEY))
    st_autorefresh(interval=interval_ms, key=f"poll-{cid}")
    polling.append(True)
    session[TICK_COST_KEY] = time.perf_counter() - started
    if not first:
        _listen_on(be, cid, state["version"], listen_until)


def _listen_on(be: ui.Backend, cid: str, version: int, until: float) -> None:
    """A tick that found a write at once has drawn it without waiting: it listens for the rest of
    its wait, so a write landing before the next tick (the ending, often) is drawn within
    milliseconds rather than a whole interval later. What is drawn is on screen meanwhile."""
    left_ms = (until - time.monotonic()) * 1000
    if left_ms < LISTEN_MIN_MS:
        return
    try:
        moved = be.store.wait_version(cid, version, int(left_ms)) != version
    except redis.RedisError:
        return  # the next tick polls again, and says so if Redis stays away
    if moved:
        st.rerun(scope="fragment")


def _empty_chat(settings: Settings, be: ui.Backend, cid: str) -> None:
    st.markdown("##### Try one of these")
    for index, example in enumerate(EXAMPLES):
        st.button(example, key=f"example-{index}", on_click=_send_text, args=(settings, be, cid, example))


def _in_flight(settings: Settings, be: ui.Backend, state: dict, turn: dict) -> None:
    now = ui.now()
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
            chart = timeline_chart(turn["steps"], turn["summary"], now=now, current=state.get("current_step"))
            if chart is not None:
                st.altair_chart(chart, width="stretch")
        if st.session_state.get(ui.STOPPING_KEY) == state["turn_id"]:
            st.info("Stop requested: the running step is being stopped.", icon="⏹️")
        else:
            st.button("⏹️ Stop", key="stop", on_click=_on_stop, args=(settings, be))


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
    """A refusal stays, with the unsent text, until it is dismissed or a message is sent."""
    flash = session.get(ui.FLASH_KEY)
    if not flash:
        return
    kind, text, unsent = flash
    with st.container(border=True):
        (st.warning if kind == "warning" else st.error)(text, icon="✋")
        if unsent and unsent.strip():
            st.caption("Your message, not sent (copy it from here):")
            st.code(unsent, language=None, wrap_lines=True)
        st.button("Dismiss", key="dismiss-flash", on_click=_dismiss_flash)
