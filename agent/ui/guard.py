"""Every part of the page draws or says, in one sentence, that it could not: never a traceback.

An exception inside an `st.fragment` is not caught by the page's `main()`: Streamlit shows it with
its traceback and, for the turn in flight, the polling stopped with it. So each fragment, and each
turn a full run draws, draws inside `drawn_or_said`. Redis not answering is said by `redis_down`,
which keeps the page retrying.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import streamlit as st
from streamlit_autorefresh import st_autorefresh

from agent.runtime.connection import is_memory_error, redis_problem

log = logging.getLogger(__name__)

REDIS_RETRY_MS = 3000  # milliseconds between retries while Redis does not answer


@contextlib.contextmanager
def drawn_or_said(what: str) -> Iterator[None]:
    """Draw inside; an error becomes a sentence naming `what` (and a log line with the traceback).

    Streamlit's own control flow (st.rerun, st.stop) derives from BaseException and passes through."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the page shows a sentence, never a traceback
        log.exception("could not draw %s", what)
        st.warning(f"{what[:1].upper()}{what[1:]} could not be drawn ({type(exc).__name__}); the rest of the "
                   "page goes on.", icon="⚠️")


def redis_down(exc: Exception) -> None:
    """Redis failed during a run: said in a sentence, and the page reruns every REDIS_RETRY_MS until it answers."""
    if is_memory_error(exc):  # it answers, but refuses writes at its memory bound
        st.error(f"**{redis_problem(exc)}.** This page retries every few seconds; nothing stored is lost.",
                 icon="🔌")
    else:
        st.error(f"**Redis is not answering** ({type(exc).__name__}). This page retries every few seconds; "
                 "nothing you sent is lost.", icon="🔌")
    st_autorefresh(interval=REDIS_RETRY_MS, key="redis-retry")
