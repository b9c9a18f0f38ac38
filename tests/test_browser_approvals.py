"""A tool that asks first, as a person sees it in the browser: `streamlit run app.py` (embedded Redis, two
workers, AGENT_APPROVE_TOOLS=calculator) driven by Debian's Chromium through Playwright. The question makes
the model ask for the calculator: the request appears in the turn with its countdown; a click on Approve
brings the tool's step and the answer; a second tab open on the conversation sees the request, then the
answer, without a click; a request whose arguments hold a right-to-left override shows its escape. Tests
wait for events, never a fixed sleep."""

from __future__ import annotations

import contextlib

import pytest

from harness import approvals as seen
from harness.page import BUSY_TEXTS, chromium, chromium_available, conversation_id, open_chat, page_server, send

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PARK_S = 30.0  # seconds from sending to the request on screen (the model answers in 0.05 s; the page may be cold)
FOLLOW_S = 10.0  # seconds for a step that follows an event already seen: a loose bound on a busy machine
CLICK_TO_TOOL_S = 3.0  # seconds from the click to the tool's step on the tab that clicked (goal p95 1 s, +margin)
OTHER_TAB_LAG_S = 3.0  # seconds the second tab may show the tool's step after the first did
SCREENSHOT = "/tmp/test_browser_approvals.png"


@pytest.fixture
def server(tmp_path):
    with page_server(tmp_path / "data", tmp_path / "streamlit.log", seen.PAGE_ENV) as running:
        yield running


@pytest.fixture
def tabs():
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        try:
            first, second = context.new_page(), context.new_page()
            for tab in (first, second):
                tab.add_init_script(seen.WATCH_JS)
            yield first, second
        finally:
            context.close()


def test_approve_in_the_browser_runs_the_tool_and_a_second_tab_follows_without_a_click(server, tabs):
    first, second = tabs
    try:
        open_chat(first, server.url)
        server.note_redis()
        send(first, seen.QUESTION)
        cid = conversation_id(first)
        seen.wait_request(first, PARK_S)
        body = first.locator("body").inner_text()
        assert "wants to run" in body and "calculator" in body and "17*23" in body, body[-2000:]
        assert "Waiting for your approval" in body and "No job is running" in body
        assert not any(b in body for b in ("Working on it", "Waiting for a worker")), "no job runs while parked"
        before, after = seen.wait_countdown_moves(first, FOLLOW_S)
        assert before.startswith("⌛ Expires in") and after.startswith("⌛ Expires in"), (before, after)

        second.goto(f"{server.url}?c={cid}")
        seen.wait_request(second, FOLLOW_S)

        first.get_by_role("button", name=seen.APPROVE).click()
        tool_at = seen.wait_seen(first, "tool", FOLLOW_S)
        seen.wait_seen(first, "answer", FOLLOW_S)
        other_tool_at = seen.wait_seen(second, "tool", FOLLOW_S)
        seen.wait_seen(second, "answer", FOLLOW_S)
        clicked_at = seen.times(first)["clicked"]
        first.screenshot(path=SCREENSHOT, full_page=True)
        print(f"\nclick to the tool's step: {tool_at - clicked_at:.2f} s; the second tab "
              f"{other_tool_at - tool_at:+.2f} s after the first")
        assert tool_at - clicked_at < CLICK_TO_TOOL_S
        assert other_tool_at - tool_at < OTHER_TAB_LAG_S
        assert seen.times(second)["clicked"] is None, "the second tab was never clicked"
        for tab in (first, second):
            tab.get_by_role("button", name=seen.APPROVE).wait_for(state="detached", timeout=FOLLOW_S * 1000)
            tab.locator("textarea[data-testid='stChatInputTextArea']:not([disabled])").wait_for(
                timeout=FOLLOW_S * 1000)
            text = tab.locator("body").inner_text()
            assert "Approved on the page" in text, text[-2000:]
            assert not any(b in text for b in BUSY_TEXTS), text[-1500:]
            assert tab.get_by_test_id("stException").count() == 0
    except BaseException:
        with contextlib.suppress(Exception):
            first.screenshot(path=SCREENSHOT, full_page=True)
        raise


def test_a_request_shows_a_right_to_left_override_as_its_escape_in_the_browser(server, tabs):
    """`000,01$` after U+202E reads `$10,000` where the browser acts on it: the card shows the escape."""
    first, _ = tabs
    try:
        open_chat(first, server.url)
        send(first, "note: pay \u202e000,01$ now")
        seen.wait_request(first, PARK_S)
        card = first.locator("[data-testid='stCode']").filter(has_text="text").first.inner_text()
        assert "\u202e" not in card and "pay \\u202e000,01$ now" in card, ascii(card)
        first.get_by_role("button", name="🚫 Deny").click()
        first.get_by_text("Declined on the page").first.wait_for(timeout=FOLLOW_S * 1000)
    except BaseException:
        with contextlib.suppress(Exception):
            first.screenshot(path=SCREENSHOT, full_page=True)
        raise
