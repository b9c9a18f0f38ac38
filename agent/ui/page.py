"""The page: wiring of state, sidebar and rendering. Every error ends as readable text, never a traceback."""

from __future__ import annotations

import logging

import redis
import streamlit as st
from streamlit_autorefresh import st_autorefresh

from agent import services
from agent.settings import Settings, SettingsError
from agent.ui import render, sidebar
from agent.ui import state as ui
from agent.ui.timeline import timeline_chart

log = logging.getLogger(__name__)

INPUT_KEY = "chat_input"
REDIS_RETRY_MS = 3000  # milliseconds between retries while Redis does not answer
EXAMPLES = (
    "What is 17*23, and what time is it in Tokyo?",
    "How does the deadline work?",
    "Please be slow 5 seconds, then tell me the time in Paris.",
)
INTRO = (
    "Each message starts a **turn** that runs as a job on a queue, in a worker process, under three clocks: "
    "every model call has its own **timeout**; the turn stops itself at its **deadline**; and the queue kills "
    "the job at its **job timeout**, a margin later. The turn writes its progress after every step, so you "
    "see each tool call as it lands, and it always says how it ended."
)


@st.cache_resource(show_spinner="Starting Redis and the workers…")
def backend(redis_url: str | None, workers: int, state_ttl_s: int) -> ui.Backend:
    # The arguments are the cache key; services.ensure itself is once per process.
    return ui.connect(Settings.from_env())


def main() -> None:
    # The page's first element, whatever happens next: the polling component lives in this one slot,
    # so a run that sees `done` always replaces it, and nothing drawn before it can shift it.
    poll_slot = st.empty()
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        _fatal("The configuration is not valid", str(exc), "Fix the variable named above and restart the app.")
        return
    try:
        be = backend(settings.redis_url, settings.workers, settings.state_ttl_s)
    except (services.ServiceError, SettingsError, redis.RedisError, OSError) as exc:
        _fatal("The page could not start its services", str(exc),
               "Check REDIS_URL (or unset it to use the embedded Redis), then reload this page.")
        return
    try:
        _page(settings, be, poll_slot)
    except redis.RedisError as exc:
        log.warning("redis failed during a page run: %s", exc)
        st.error(f"**Redis is not answering** ({type(exc).__name__}). This page retries every few seconds; "
                 "nothing you sent is lost.", icon="🔌")
        with poll_slot:
            st_autorefresh(interval=REDIS_RETRY_MS, key="redis-retry")
    except Exception as exc:  # noqa: BLE001 - a page shows a sentence, never a traceback
        log.exception("page run failed")
        st.error(f"Something went wrong while drawing this page ({type(exc).__name__}). Reload to try again.")


def _fatal(title: str, detail: str, hint: str) -> None:
    st.title("⏱️ Agent demo")
    st.error(f"**{title}.**\n\n{detail}\n\n{hint}", icon="🛑")


def _page(settings: Settings, be: ui.Backend, poll_slot) -> None:
    session = st.session_state
    conversation = ui.resolve_conversation(st.query_params.get(ui.CID_PARAM), session, be.store, settings.state_ttl_s)
    cid = conversation.id
    result = ui.poll(be.store, be.queue_connection, session, cid,
                     wait_ms=ui.poll_wait_ms(settings.poll_interval_ms))
    state = result.state
    in_flight = state is not None and not state["done"]
    # Polling, as the page's FIRST element: a run that sees `done` replaces the component at once with
    # an empty slot. Drawn last, it would go only when a run completes, and a tick that interrupts
    # every run (a run slower than the interval) would keep it, and the reruns, alive for ever.
    if in_flight:
        with poll_slot:
            st_autorefresh(interval=settings.poll_interval_ms, key=f"poll-{cid}")
    else:
        poll_slot.empty()
    # The sidebar comes after: its widgets are places where a tick's rerun request can cut a run short,
    # and a run must reach the component above first, or a page that is done could keep polling.
    config, config_error = sidebar.render_sidebar(settings.turn)
    st.sidebar.divider()
    st.sidebar.button("🗨️ New chat", on_click=_new_chat, width="stretch")

    st.title("⏱️ An agent that always finishes")
    st.caption(INTRO)
    if conversation.notice:
        st.query_params.pop(ui.CID_PARAM, None)
        st.info(conversation.notice, icon="🔎")
        st.toast("That conversation was not found: this is a new chat.", icon="🔎")
    if state is not None and st.query_params.get(ui.CID_PARAM) != cid:
        st.query_params[ui.CID_PARAM] = cid  # the first message makes the chat a link: reload and tabs follow it
    if result.lost:
        st.toast("The worker running this turn was lost; its ending has been written.", icon="🛑")

    if state is None or not state["history"]:
        _empty_chat(settings, be, cid)
    else:
        turns = render.split_turns(state)
        for index, turn in enumerate(turns):
            render.render_turn(turn, latest=index == len(turns) - 1)
        if in_flight:
            _in_flight(settings, be, state, turns[-1])

    _flash(session)
    if in_flight:
        st.caption("✋ The input is off while this reply is being written: one turn at a time. "
                   "Press **Stop** to end it early.")
    elif config is None:
        st.caption(f"✋ Fix the settings in the sidebar to send a message: {config_error}")
    st.chat_input(
        "Ask something that needs a tool…" if not in_flight else "Wait for the reply, or press Stop…",
        key=INPUT_KEY,
        disabled=in_flight or config is None,
        on_submit=_on_send,
        args=(settings, be, cid),
    )


def _empty_chat(settings: Settings, be: ui.Backend, cid: str) -> None:
    st.markdown("##### Try one of these")
    for index, example in enumerate(EXAMPLES):
        st.button(example, key=f"example-{index}", on_click=_send_text, args=(settings, be, cid, example))


def _in_flight(settings: Settings, be: ui.Backend, state: dict, turn: dict) -> None:
    now = ui.now()
    with st.container(border=True):
        if state["status"] == "queued":
            info = ui.queue_info(be, state)
            if info.job_status == "started":
                # Safeguards off: the job runs but writes nothing until it ends.
                timeout = (state.get("config") or {}).get("job_timeout_s")
                st.markdown(f"**A worker is running this turn with safeguards off.** It writes nothing until it "
                            f"ends, so there is nothing to show yet. The queue kills it {timeout} s after it "
                            f"started at the latest, and this page will say so.")
                waited = now - (state.get("enqueued_at") or now)
                if timeout:
                    st.progress(min(1.0, waited / timeout),
                                text=f"{waited:.0f} s since it was sent, of the {timeout} s job timeout")
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
            st.info("Stop requested: the turn stops at its next check, at the latest when the running step's "
                    "timeout runs out.", icon="⏹️")
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
        st.session_state[ui.FLASH_KEY] = ("error", f"Not sent: Redis is not answering ({type(exc).__name__}).", text)


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
    st.query_params.pop(ui.CID_PARAM, None)


def _flash(session) -> None:
    flash = session.pop(ui.FLASH_KEY, None)
    if not flash:
        return
    kind, text, unsent = flash
    (st.warning if kind == "warning" else st.error)(text, icon="✋")
    if unsent and unsent.strip():
        with st.expander("Your message, not sent (copy it from here)", expanded=False):
            st.code(unsent, language=None, wrap_lines=True)
