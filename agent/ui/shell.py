"""The app around the page: which host names it answers at, its services, and the screens it shows
when it cannot draw the page. Every error ends as readable text, never a traceback.

app.py (which Streamlit re-executes on every run) calls `main`; the page itself is agent/ui/layout.py.
"""

from __future__ import annotations

import gc
import logging
import os

import redis
import streamlit as st

from agent.conversation.well_formed import UnreadableState
from agent.hosting import services
from agent.hosts import host_allowed
from agent.settings import (
    ALLOWED_HOSTS_VARIABLE,
    DEFAULT_ALLOWED_HOSTS,
    Settings,
    SettingsError,
    allowed_hosts,
)
from agent.ui import layout, signin
from agent.ui import state as ui
from agent.ui.guard import redis_down

log = logging.getLogger(__name__)

# Everything imported so far (Streamlit, Altair, pandas, the product) lives as long as the server: out
# of the collector's reach, a full collection no longer walks it (~150 ms each, with the GIL held).
# This module is imported once per server process (app.py, which Streamlit re-executes, imports it),
# and it imports every module of the page.
gc.freeze()


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
        person = signin.signed_in(settings, be.store.redis)
    except redis.RedisError as exc:
        log.warning("redis failed during a page run: %s", exc)
        redis_down(exc)
        return
    if person is False:  # the sign-in page was drawn instead
        return
    try:
        if person is not None:
            signin.remember_once(be.store.redis, person)
            be = be.for_person(person, settings)
        layout.page(settings, be)
    except redis.RedisError as exc:
        log.warning("redis failed during a page run: %s", exc)
        redis_down(exc)
    except UnreadableState as exc:  # became unreadable after this run found it readable
        log.warning("%s", exc)
        st.error(f"**This conversation cannot be read:** {ui.unreadable_sentence(exc)} Start a new chat.",
                 icon="🛑")
        layout.new_chat_button()
    except Exception as exc:  # noqa: BLE001 - a page shows a sentence, never a traceback
        log.exception("page run failed")
        st.error(f"Something went wrong while drawing this page ({type(exc).__name__}). Reload to try again, "
                 "or start a new chat.")
        layout.new_chat_button()


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
