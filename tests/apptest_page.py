"""The page under Streamlit's AppTest, for the test modules that drive it headless: opening it on a
conversation, reading what it shows, and finding its components and elements."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from agent.hosting import services
from tests.conftest import ROOT

APP = str(ROOT / "app.py")
RUN_TIMEOUT_S = 15


@contextlib.contextmanager
def page_environment(redis_url: str, env: dict[str, str]) -> Iterator[None]:
    """The app reads REDIS_URL and friends from the environment; its services are process-wide, so
    they are stopped (and Streamlit's resource cache cleared) when the module using them is done."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REDIS_URL", redis_url)
        for name, value in env.items():
            mp.setenv(name, value)
        yield
        services.shutdown()
        st.cache_resource.clear()


def app(cid: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=RUN_TIMEOUT_S)
    if cid:
        at.query_params["c"] = cid
    return at


def texts(at: AppTest) -> str:
    """Every piece of text on the page (an exception's included), for plain assertions."""
    parts = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "code", "title", "toast", "exception"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [str(e.label) for e in at.expander]
    # Untrusted text reaches the page with its Markdown characters escaped; read it as shown.
    return re.sub(r"\\(.)", r"\1", "\n".join(parts))


def walk(node):
    """Every node of the element tree below `node`, itself first."""
    yield node
    for child in getattr(node, "children", {}).values():
        yield from walk(child)


def autorefreshes(at: AppTest) -> list[dict]:
    """The arguments of each streamlit-autorefresh component (AppTest shows one as an unknown element)."""
    found = []
    for node in walk(at._tree):
        proto = getattr(node, "proto", None)
        if "autorefresh" in str(getattr(proto, "component_name", "")):
            found.append(json.loads(proto.json_args))
    return found
