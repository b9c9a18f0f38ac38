"""What the page's buttons and input do. Each runs before the next script run, so that run draws its outcome at once."""

from __future__ import annotations

import redis
import streamlit as st

from agent.runtime.connection import is_memory_error, redis_problem
from agent.settings import Settings, SettingsError
from agent.ui import sidebar
from agent.ui import state as ui

INPUT_KEY = "chat_input"
SHOW_ALL_KEY = "agent_show_all_turns"  # the conversation id whose earlier turns the user asked to see


def on_send(settings: Settings, be: ui.Backend, cid: str) -> None:
    send_text(settings, be, cid, st.session_state.get(INPUT_KEY))


def send_text(settings: Settings, be: ui.Backend, cid: str, text: str | None) -> None:
    try:
        config, error = sidebar.next_turn_config(settings.turn), None
    except SettingsError as exc:
        config, error = None, str(exc)
    try:
        ui.send(be.store, be.queue, st.session_state, cid, text, config, error, be.share, be.daily_budget_usd)
    except redis.RedisError as exc:
        why = redis_problem(exc) if is_memory_error(exc) else f"Redis is not answering ({type(exc).__name__})"
        st.session_state[ui.FLASH_KEY] = ("error", f"Not sent: {why}.", text)


def on_stop(settings: Settings, be: ui.Backend) -> None:
    view = st.session_state.get(ui.VIEW_KEY)
    if view and not view["state"]["done"]:
        try:
            ui.stop(be.store, st.session_state, view["state"], settings.state_ttl_s, be.queue_connection)
        except redis.RedisError as exc:
            st.session_state[ui.FLASH_KEY] = ("error", f"Could not ask the turn to stop ({type(exc).__name__}).",
                                              None)


def new_chat() -> None:
    ui.new_chat(st.session_state)
    st.session_state.pop(SHOW_ALL_KEY, None)
    st.query_params.pop(ui.CID_PARAM, None)


def show_all(cid: str) -> None:
    st.session_state[SHOW_ALL_KEY] = cid


def dismiss_flash() -> None:
    st.session_state.pop(ui.FLASH_KEY, None)
