"""Every part of the page draws or says, in one sentence, that it could not: never a traceback.

An exception inside an `st.fragment` is not caught by the page's `main()`: Streamlit shows it with
its traceback and, for the turn in flight, the polling stopped with it. So each fragment, and each
turn a full run draws, draws inside `drawn_or_said`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import streamlit as st

log = logging.getLogger(__name__)


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
