"""The sidebar's tool sources, headless with AppTest against the session's real Redis: what the
workers published is listed (its untrusted text escaped), and a choice of tools goes to the next turn."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from agent.hosting import services
from agent.tools.catalogue import CATALOGUE_KEY
from agent.ui.tool_sources import CHOSEN_KEY, OFFERED_KEY, chosen
from tests.conftest import ROOT

CATALOGUE = {"sources": [
    {"name": "built-in", "kind": "built-in", "error": None,
     "tools": [{"name": "calculator", "description": "Arithmetic."}, {"name": "wait", "description": "Slow."}]},
    {"name": "time", "kind": "MCP, stdio", "error": None,
     "tools": [{"name": "time__get_current_time", "description": "![x](http://127.0.0.1:9/t.png) Time."}]},
    {"name": "broken", "kind": "MCP, stdio", "tools": [],
     "error": "did not start: ![pixel](http://127.0.0.1:9/p.png)"},
]}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def app_env(redis_url):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REDIS_URL", redis_url)
        mp.setenv("AGENT_WORKERS", "0")
        yield
        services.shutdown()
        st.cache_resource.clear()


@pytest.fixture
def catalogue(redis_client):
    before = redis_client.get(CATALOGUE_KEY)
    redis_client.set(CATALOGUE_KEY, json.dumps(CATALOGUE))
    yield
    if before is None:
        redis_client.delete(CATALOGUE_KEY)
    else:
        redis_client.set(CATALOGUE_KEY, before)


def test_the_page_lists_the_tool_sources_without_importing_the_mcp_sdk():
    probe = "import sys, agent.ui.tool_sources; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_tool_is_chosen_unless_some_are_left_out():
    offered = ["calculator", "wait"]
    assert chosen({}) is None
    assert chosen({CHOSEN_KEY: ["wait", "calculator"], OFFERED_KEY: offered}) is None
    assert chosen({CHOSEN_KEY: ["wait"], OFFERED_KEY: offered}) == ("wait",)
    assert chosen({CHOSEN_KEY: [], OFFERED_KEY: offered}) == ()


def test_the_sidebar_lists_the_sources_escapes_what_servers_say_and_passes_the_choice_on(catalogue):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=15).run()
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "**time** (MCP, stdio): 1 tool(s)" in captions and "**built\\-in** (built\\-in): 2 tool(s)" in captions
    (warning,) = [w for w in at.sidebar.warning if "broken" in w.value]
    assert "!\\[pixel\\]\\(http" in warning.value  # escaped: shown as typed, never fetched as an image
    picker = at.sidebar.multiselect(key=CHOSEN_KEY)
    assert picker.value == ["calculator", "wait", "time__get_current_time"]
    picker.unselect("wait").run()
    assert chosen(at.session_state) == ("calculator", "time__get_current_time")
