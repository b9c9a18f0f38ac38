"""Branches as a person uses them in the browser: `streamlit run app.py` (embedded Redis, two workers, the demo
model) driven by Debian's Chromium through Playwright. Regenerate an answer, edit the first question, flip between
three branches with the picker (the old branch's turns gone at once, never left faded); two tabs, one switches
and the other follows; an edit while a turn runs is refused with "Stop it first" and the text stays in the editor.
Set AGENT_SCREENSHOTS=1 to also refresh docs/screenshots/branches.png. Tests wait for events, never a fixed sleep."""

from __future__ import annotations

import os
import time

import pytest

from agent.ui import follower
from harness.page import (
    STALE_MS,
    STALE_WATCH_JS,
    TWICE_MS,
    chromium,
    chromium_available,
    conversation_id,
    open_chat,
    page_server,
    send,
    stale_report,
    wait_settled,
    watch_stale,
)
from tests.conftest import ROOT

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE_ENV = {"AGENT_MODEL": "demo@0.05~0", "AGENT_WORKERS": "2"}
QUESTION = "What is 17*23?"
ANSWER = "391"
EDITED = "What is 6*7?"
EDITED_ANSWER = "42"
TURN_S = 60.0  # seconds for a turn to be answered and the page settled (a cold page on a busy machine included)
FOLLOW_S = 15.0  # seconds for the page (or another tab) to show what it was asked to: a loose bound
SCREENSHOT = ROOT / "docs" / "screenshots" / "branches.png"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("branches")
    with page_server(tmp / "data", tmp / "streamlit.log", PAGE_ENV) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with chromium() as running:
        yield running


@pytest.fixture
def context(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1200})
    context.add_init_script(STALE_WATCH_JS)
    try:
        yield context
    finally:
        context.close()


def button(page, name: str):
    return page.get_by_role("button", name=name, exact=True)


# The conversation's turns (not the sidebar, whose list names other conversations by their titles).
MAIN_TEXT_JS = ("[...document.querySelectorAll('[data-testid=\"stChatMessage\"]')].map((m) => m.innerText)"
                ".join('\\n')")


def main_text(page) -> str:
    return page.evaluate(f"() => {MAIN_TEXT_JS}")


def wait_text(page, text: str, timeout_s: float = FOLLOW_S) -> None:
    page.wait_for_function(f"(t) => {MAIN_TEXT_JS}.includes(t)", arg=text, timeout=timeout_s * 1000)


def wait_gone(page, text: str, timeout_s: float = FOLLOW_S) -> None:
    """Gone from the page: not shown, and not kept faded either (a stale element is still in the page's text)."""
    page.wait_for_function(f"(t) => !{MAIN_TEXT_JS}.includes(t)", arg=text, timeout=timeout_s * 1000)


def ask_first(page, url: str) -> str:
    open_chat(page, url)
    send(page, QUESTION)
    cid = conversation_id(page)
    wait_settled(page, ANSWER, TURN_S)
    return cid


def edit_first_question(page, text: str) -> None:
    button(page, "✏️ Edit").first.click()
    editor = page.get_by_label("Edit your message")
    editor.wait_for(timeout=FOLLOW_S * 1000)
    assert editor.input_value() == QUESTION
    editor.fill(text)
    button(page, "Send").click()


def test_regenerate_edit_the_first_question_and_flip_between_three_branches(server, context):
    page = context.new_page()
    ask_first(page, server.url)
    button(page, "🔄 Regenerate").click()
    wait_text(page, "2 / 2", TURN_S)
    wait_settled(page, ANSWER, TURN_S)
    edit_first_question(page, EDITED)
    wait_text(page, "3 / 3", TURN_S)
    wait_settled(page, EDITED_ANSWER, TURN_S)
    assert QUESTION not in main_text(page)  # the edited branch alone is shown
    button(page, "‹").click()
    wait_text(page, "2 / 3")
    wait_gone(page, EDITED)  # the other branch's turns are gone, not left faded
    wait_settled(page, ANSWER, FOLLOW_S)
    button(page, "‹").click()
    wait_text(page, "1 / 3")
    assert button(page, "‹").is_disabled()
    button(page, "›").click()
    wait_text(page, "2 / 3")
    button(page, "›").click()
    wait_text(page, "3 / 3")
    wait_settled(page, EDITED_ANSWER, FOLLOW_S)
    wait_gone(page, QUESTION)
    report = stale_report(page)
    assert report["staleMs"] < STALE_MS, report
    if os.environ.get("AGENT_SCREENSHOTS"):
        button(page, "‹").click()
        wait_text(page, "2 / 3")
        wait_settled(page, ANSWER, FOLLOW_S)
        page.locator('[data-testid="stChatMessage"]').first.scroll_into_view_if_needed()
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_two_tabs_one_switches_and_the_other_follows(server, context):
    first, second = context.new_page(), context.new_page()
    cid = ask_first(first, server.url)
    edit_first_question(first, EDITED)
    wait_text(first, "2 / 2", TURN_S)
    wait_settled(first, EDITED_ANSWER, TURN_S)
    second.goto(f"{server.url}?c={cid}")
    wait_text(second, "2 / 2", TURN_S)
    wait_text(second, EDITED)
    button(first, "‹").click()
    wait_text(first, "1 / 2")
    wait_text(second, "1 / 2")  # without a click: the version moved, and its follower saw it
    wait_gone(second, EDITED)
    second.reload()  # a reload shows the same branch
    wait_text(second, "1 / 2", TURN_S)
    assert EDITED not in main_text(second)


def test_an_edit_while_a_turn_runs_is_refused_with_stop_first_and_the_text_stays_in_the_editor(server, context):
    page = context.new_page()
    ask_first(page, server.url)
    send(page, "Please be slow 20 seconds, then tell me the time in Paris.")
    button(page, "⏹️ Stop").wait_for(timeout=TURN_S * 1000)
    edit_first_question(page, "What is 5*5?")
    page.get_by_text("Stop it first").wait_for(timeout=FOLLOW_S * 1000)
    assert page.get_by_label("Edit your message").input_value() == "What is 5*5?"
    assert "1 / 2" not in main_text(page)  # nothing was sent
    button(page, "⏹️ Stop").click()
    wait_text(page, "Stop", TURN_S)


def test_a_regenerate_that_outlives_a_followers_run_is_drawn_once_and_never_left_faded(server, context):
    """A regenerate whose model hangs until its deadline (36 s: past the follower's 30 s run, where a long turn once
    grew a frozen copy): its question once, its place "2 / 2" from the start, nothing left faded, its ending."""
    page = context.new_page()
    cid = ask_first(page, server.url)
    open_chat(page, f"{server.url}?c={cid}&scenario=hang&job_timeout=40&margin=4")  # the next message's clocks
    wait_settled(page, ANSWER, TURN_S)
    started = time.monotonic()
    button(page, "🔄 Regenerate").click()
    watch_stale(page, QUESTION)
    wait_text(page, "2 / 2")  # while it runs: the turn in flight says where it sits
    wait_settled(page, "Ran out of time", TURN_S + 40)
    assert time.monotonic() - started > follower.HOLD_S
    report = stale_report(page)
    assert report["staleMs"] < STALE_MS, report
    assert report["twiceMs"] < TWICE_MS and report["mostQuestions"] == 1, report
    assert "2 / 2" in main_text(page) and not button(page, "‹").is_disabled()  # its arrows, once it ended
