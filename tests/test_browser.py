"""The page end to end: `streamlit run app.py` on its own embedded Redis and workers, driven by
Debian's Chromium through Playwright. Set AGENT_SCREENSHOTS=1 to also refresh docs/screenshots/."""

from __future__ import annotations

import json
import os
import time

import pytest
from playwright.sync_api import expect

from agent.ui.sidebar import SETTINGS_LABEL
from harness.page import (
    AUTOREFRESH,
    INPUT,
    REBOUND_HOST,
    START_TIMEOUT_S,
    chromium,
    chromium_available,
    page_server,
    wait_settled,
)
from tests.conftest import CANARY_KEY, ROOT

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is 17*23, and what time is it in Tokyo?"
ANSWER = "17*23 = 391"
POLL_INTERVAL_MS = 1000  # the default
SCREENSHOTS = ROOT / "docs" / "screenshots"
PAGE_ENV = {
    "AGENT_POLL_INTERVAL_MS": str(POLL_INTERVAL_MS),
    "AGENT_MODEL": "demo@0.8",  # each model call takes 0.8 s, so every step can be seen landing
    "OPENAI_API_KEY": CANARY_KEY,  # the sidebar may say a key is set, never show it
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    with page_server(tmp / "data", tmp / "streamlit.log", PAGE_ENV) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with chromium() as running:
        yield running


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


def ask(page, url: str, question: str) -> None:
    page.goto(url)
    page.wait_for_selector(INPUT, timeout=START_TIMEOUT_S * 1000)
    page.fill(INPUT, question)
    page.keyboard.press("Enter")


def open_settings(page):
    """The sidebar's settings for the next message: a popover, whose widgets exist only once it is open."""
    page.get_by_test_id("stSidebar").get_by_role("button", name=SETTINGS_LABEL).click()
    body = page.get_by_test_id("stPopoverBody")
    body.wait_for(timeout=10000)
    return body


def click_until(button, outcome, within_s: float = 15, attempts: int = 3) -> None:
    """Click `button` until `outcome` shows, as a person would click again. Measured: a click that lands
    while Streamlit lays the sidebar out again (a run still sending it) can go down on the button and
    come up on the text beside it, and the browser then sends nothing; a person clicks again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for attempt in range(attempts):
        button.click()
        try:
            outcome.wait_for(timeout=within_s * 1000 / attempts)
            return
        except PlaywrightTimeoutError:
            if attempt == attempts - 1 or not button.is_visible():  # the click did something else: say so
                raise


def quiet_for(sent_at: list[float], quiet_s: float, within_s: float) -> bool:
    """True once no websocket frame was sent for `quiet_s`, waiting at most `within_s`."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        last = sent_at[-1] if sent_at else 0.0
        if time.monotonic() - last >= quiet_s:
            return True
        time.sleep(0.1)
    return False


def test_a_new_chats_input_reaches_the_browser_before_the_rest_of_the_page(server, page):
    """The browser loads the input's code as soon as it is drawn: a new chat sends it right after the
    header, alone, not behind the sidebar's widgets (layout.page)."""
    frames: list[str] = []

    def note(payload) -> None:
        raw = payload if isinstance(payload, bytes) else payload.encode()
        frames.append("input" if b"needs a tool" in raw else "settings" if SETTINGS_LABEL.encode() in raw else "")

    page.on("websocket", lambda ws: ws.on("framereceived", note))
    page.goto(server.url)
    page.wait_for_selector(f"{INPUT}:not([disabled])", timeout=START_TIMEOUT_S * 1000)
    page.get_by_test_id("stSidebar").get_by_role("button", name=SETTINGS_LABEL).wait_for(timeout=10000)
    assert "input" in frames and "settings" in frames, frames
    assert frames.index("input") < frames.index("settings")


def test_a_question_shows_each_tool_step_before_the_answer_then_stops_polling(server, page):
    sent_at: list[float] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda _: sent_at.append(time.monotonic())))
    # Model calls of 2 s (the URL's latency): each step stays on screen for seconds before the next, also
    # on a machine as busy as a full test run in 5 processes (with the demo's 0.8 s, the first step and
    # the answer once reached the screen in one render there).
    ask(page, f"{server.url}?latency=2", QUESTION)
    server.note_redis()
    page.wait_for_url("**c=*", timeout=15000)
    page.wait_for_selector(AUTOREFRESH, state="attached", timeout=15000)  # polling while in flight

    page.get_by_text("calculator(17*23)").first.wait_for(timeout=20000)
    assert page.get_by_text(ANSWER).count() == 0, "the first tool step lands before the answer"
    page.get_by_text("current_time(Asia/Tokyo)").first.wait_for(timeout=20000)
    page.get_by_text(ANSWER).first.wait_for(timeout=20000)
    page.get_by_text("The three clocks for this turn").first.wait_for(timeout=10000)

    # Polling stops once done: the browser asks for no more reruns. (Streamlit may keep the removed
    # component's iframe in the DOM as a hidden, stale node; what matters is that it no longer ticks.)
    # (An idle page still follows the conversation, by a blocking read on the server: no request from
    # the browser. Its one-shot start fires once, right after the full run.)
    assert quiet_for(sent_at, POLL_INTERVAL_MS / 1000 * 5, within_s=10), "reruns go on after done"
    assert page.locator(INPUT).is_enabled()

    url = page.url
    page.reload()
    page.get_by_text(ANSWER).first.wait_for(timeout=20000)
    assert page.url == url
    page.get_by_text("calculator(17*23)").first.wait_for(timeout=5000)


def test_the_settings_are_drawn_only_once_opened_and_then_all_there(server, page):
    page.goto(server.url)
    page.wait_for_selector(INPUT, timeout=START_TIMEOUT_S * 1000)
    # Closed, none of their widgets is in the page: the first screen does not pay for them.
    assert page.get_by_test_id("stNumberInput").count() == 0
    assert page.get_by_test_id("stSelectbox").count() == 0
    assert page.get_by_test_id("stSidebar").get_by_text("The turn stops itself").count() == 1  # what they amount to
    settings = open_settings(page)
    for label in ("Provider", "Scenario", "Model latency (s)", "Job timeout (s)", "Deadline margin (s)",
                  "Call timeout cap (s)", "Minimum for a call (s)", "Safeguards off (the naive loop)"):
        settings.get_by_text(label, exact=True).first.wait_for(timeout=10000)
    settings.get_by_text("Tools", exact=True).first.wait_for(timeout=10000)


def test_a_page_reached_under_a_foreign_host_name_shows_no_conversation(server, page):
    ask(page, server.url, "What is 19*23?")
    page.wait_for_url("**/?c=*", timeout=15000)
    page.get_by_text("19*23 = 437").first.wait_for(timeout=30000)
    rebound = page.url.replace("127.0.0.1", REBOUND_HOST)  # the same page and conversation, another name

    page.goto(rebound)
    page.get_by_text("This page answers only at").wait_for(timeout=START_TIMEOUT_S * 1000)
    assert page.get_by_text("19*23").count() == 0, "the conversation is not shown under a foreign name"
    assert page.locator(INPUT).count() == 0, "nothing can be sent under a foreign name"


@pytest.mark.skipif(not os.environ.get("AGENT_SCREENSHOTS"),
                    reason="set AGENT_SCREENSHOTS=1 to refresh the README's screenshots")
def test_screenshots_for_the_readme(server, browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1300, "height": 1950}, device_scale_factor=1)
    page = context.new_page()
    try:
        ask(page, server.url, QUESTION)
        wait_settled(page, ANSWER, timeout_s=30)
        page.wait_for_timeout(800)
        page.screenshot(path=str(SCREENSHOTS / "chat.png"), full_page=True)

        # A reply being written: the demo streams its docs answer at a rate a person can follow.
        page.get_by_role("button", name="New chat").click()
        page.fill(INPUT, "How does the deadline work?")
        page.keyboard.press("Enter")
        page.get_by_text("Writing…").first.wait_for(timeout=30000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(SCREENSHOTS / "live.png"), full_page=True)
        wait_settled(page, "The three clocks for this turn", timeout_s=60)

        # The hang scenario on the short demo clocks: it ends timed out, before the deadline.
        page.get_by_role("button", name="New chat").click()
        settings = open_settings(page)
        settings.get_by_role("button", name="Demo clocks").click()
        job_timeout = settings.get_by_test_id("stNumberInput").filter(has_text="Job timeout").locator("input")
        job_timeout.wait_for()
        # The demo clocks were applied (the rerun the click asked for may land a moment later), and the settings
        # stay open.
        expect(job_timeout).to_have_value("20", timeout=10000)
        settings.get_by_test_id("stSelectbox").nth(1).click()  # the scenario
        page.get_by_role("option", name="hang").click()
        page.wait_for_timeout(500)
        page.keyboard.press("Escape")  # the settings close; the chat input is reachable again
        page.fill(INPUT, "What is 17*23?")
        page.keyboard.press("Enter")
        wait_settled(page, "Ran out of time", timeout_s=30)
        page.wait_for_timeout(1000)
        page.get_by_test_id("stExpander").filter(has_text="The three clocks").last.screenshot(
            path=str(SCREENSHOTS / "timeline.png"))

        # The fourth clock: the verbose scenario on a $0.02 budget, its money bar beside the time bar.
        page.get_by_role("button", name="New chat").click()
        settings = open_settings(page)
        settings.get_by_test_id("stSelectbox").nth(1).click()  # the scenario
        page.get_by_role("option", name="verbose").click()
        for label, value in (("US dollars a turn", "0.02"), ("Model latency", "1.5")):
            field = settings.get_by_test_id("stNumberInput").filter(has_text=label).locator("input")
            field.fill(value)
            field.press("Enter")
            page.wait_for_timeout(500)
        page.keyboard.press("Escape")
        page.fill(INPUT, QUESTION)
        page.keyboard.press("Enter")
        page.get_by_text("kept for the answer").first.wait_for(timeout=30000)  # the money bar, mid-turn
        page.wait_for_timeout(700)
        page.screenshot(path=str(SCREENSHOTS / "budget.png"), full_page=True)
        wait_settled(page, "This turn cost", timeout_s=60)
        assert page.get_by_text("of a $0.0200 budget").count() >= 1
    finally:
        context.close()


def test_an_mcp_tool_from_mcp_json_is_listed_and_its_step_lands_in_the_page(tmp_path, browser):
    env = {**PAGE_ENV, "AGENT_MCP_CONFIG": str(ROOT / "mcp.json")}  # the shipped config: mcp-server-time
    with page_server(tmp_path / "data", tmp_path / "streamlit.log", env) as mcp_page:
        context = browser.new_context(viewport={"width": 1300, "height": 1800}, device_scale_factor=1)
        page = context.new_page()
        try:
            ask(page, mcp_page.url, "What time is it in Tokyo via get_current_time?")
            page.get_by_text("time__get_current_time").first.wait_for(timeout=60000)
            page.get_by_text("Asia/Tokyo").first.wait_for(timeout=30000)  # the server's own answer
            wait_settled(page, "Asia/Tokyo", timeout_s=30)
            settings = open_settings(page)
            settings.get_by_text("time", exact=True).first.wait_for(timeout=10000)  # the source, by its name
            assert settings.get_by_text("The workers have not listed their tools yet.").count() == 0
            if os.environ.get("AGENT_SCREENSHOTS"):
                page.wait_for_timeout(800)
                page.screenshot(path=str(SCREENSHOTS / "mcp_tool.png"), full_page=True)
        finally:
            context.close()


class Canary:
    """A loopback HTTP server that counts every request: a hostile reply must never reach it."""

    def __init__(self):
        import http.server
        import threading

        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


TURN_ID = "t1"


def open_finished_turn(page, server, question: str, reply: str, steps: list[dict], now: float) -> None:
    """Write one finished turn straight into the page's Redis (as a worker would), then open it."""
    from agent.conversation.store import Store
    from agent.runtime.connection import state_client
    from harness.page import open_chat

    open_chat(page, server.url)  # the page has started its Redis
    store = Store(state_client(server.redis_url()), ttl_s=600)
    cid = f"finished{time.time_ns()}"
    doc = {"status": "running", "job_id": "none", "enqueued_at": now, "started_at": now,
           "deadline_at": now + 100, "job_timeout_at": now + 120}
    try:
        store.begin_turn(cid, TURN_ID, {"role": "user", "content": question}, doc)
        store.publish(cid, TURN_ID, {**doc, "status": "done", "error": None}, done=True,
                      new_messages=[{"role": "assistant", "content": reply}], new_steps=steps,
                      summary={"turn_id": TURN_ID, "status": "done", "started_at": now, "deadline_at": now + 100,
                               "job_timeout_at": now + 120, "ended_at": now + 1, "config": {}})
    finally:
        store.redis.close()
    page.goto(f"{server.url}?c={cid}")


def test_a_hostile_reply_is_shown_inert_and_no_key_reaches_the_page(server, page):
    canary = Canary()
    try:
        hostile = (
            f"<script>window.__pwned = 1; fetch('{canary.url}/script')</script>\n\n"
            f"<img src=x onerror=\"window.__pwned = 2; fetch('{canary.url}/onerror')\">\n\n"
            f"![tracking pixel]({canary.url}/markdown.png)\n\n"
            f"[ref image]: {canary.url}/ref.png\n![ref][ref image]\n\n"
            f"<iframe src=\"{canary.url}/iframe\"></iframe> done"
        )
        image = f"![pixel]({canary.url}/%s.png)"
        now = time.time()
        steps = [
            {"turn_id": TURN_ID, "index": 1, "kind": "tool", "name": image % "tool-name", "started_at": now,
             "ended_at": now + 0.1, "duration_s": 0.1, "timeout_s": 50, "remaining_s": 50, "outcome": "ok",
             "arguments": json.dumps({"q": image % "argument"}), "result": image % "result"},
            {"turn_id": TURN_ID, "index": 2, "kind": "model", "name": "demo", "started_at": now + 0.1,
             "ended_at": now + 0.2, "duration_s": 0.1, "timeout_s": 50, "remaining_s": 50, "outcome": "error",
             "detail": image % "provider-error", "attempt": 1},
        ]
        open_finished_turn(page, server, "say something nasty", hostile, steps, now)
        page.get_by_text("say something nasty", exact=True).first.wait_for(timeout=20000)
        page.get_by_text("tracking pixel").first.wait_for(timeout=10000)  # the image became its alt text
        page.wait_for_timeout(1500)
        assert page.evaluate("() => window.__pwned") is None
        assert page.locator(f"img[src^='{canary.url}']").count() == 0
        assert page.locator(f"iframe[src^='{canary.url}']").count() == 0
        assert canary.hits == []
        html = page.content()
        assert CANARY_KEY not in html
    finally:
        canary.stop()


LINK_SCHEMES = ["data", "javascript", "vbscript", "file", "ftp", "intent"]
CLICKABLE_PROTOCOLS = {"http:", "https:", "mailto:"}
QUOTES = [("> ", "> "), ("> > ", "> > "), ("- > ", "  > ")]  # a block quote, nested, in a list item


def hostile_links() -> str:
    """Every spelling of each scheme, in each link form a reply can use, one a line."""
    from tests.test_markdown import scheme_spellings

    lines = []
    for scheme in LINK_SCHEMES:
        lines.append(f"<{scheme}:autolink> <{scheme.upper()}:autolink>")
        for n, spelling in enumerate(scheme_spellings(scheme)):
            label = f"{scheme}-{n}"
            lines += [f"[inline {label}]({spelling}x) [pointy {label}](<{spelling}x>) "
                      f"[titled {label}]( {spelling}x 'title')",
                      f"[def {label}]: {spelling}x", "", f"[def {label}]", ""]
            for k, (first, next_line) in enumerate(QUOTES):  # the destination on the next line, behind `>`
                lines += [f"{first}[quoted {label}-{k}](", f"{next_line}{spelling}x)", "",
                          f"{first}[qdef {label}-{k}]:", f"{next_line}{spelling}x", f"{first.rstrip()}",
                          f"{first}[qdef {label}-{k}]", ""]
    lines += ["[ok-http](https://e.test/ok) <https://e.test/auto> [ok-mail](mailto:a@e.test) [ok-anchor](#top)",
              "", "END-OF-LINKS"]
    return "\n".join(lines)


def test_a_reply_links_only_to_web_pages_and_mail_addresses_in_the_browser(server, page):
    """What Chromium makes clickable in a rendered reply, whatever the spelling of the scheme."""
    open_finished_turn(page, server, "links please", hostile_links(), [], time.time())
    page.get_by_text("END-OF-LINKS").first.wait_for(timeout=20000)
    links = page.evaluate("""() => Array.from(
        document.querySelectorAll('[data-testid="stChatMessage"] [data-testid="stMarkdownContainer"] a'))
        .map(a => [a.protocol, a.getAttribute("href"), a.textContent])""")
    assert [link for link in links if link[0] not in CLICKABLE_PROTOCOLS] == []
    shown = {text for _, _, text in links}
    assert {"ok-http", "https://e.test/auto", "ok-mail", "ok-anchor"} <= shown
    hostile = [text for text in shown if text.split(" ")[0] in ("inline", "pointy", "titled", "def", "quoted", "qdef")
               or "autolink" in text]
    assert hostile == []  # not even as a dead `#` link
    assert page.locator('[data-testid="stChatMessage"] [data-testid="stMarkdownContainer"] img').count() == 0


# -- following a turn in real time ---------------------------------------------------------------

STREAM_WORDS = 30  # words per reply from the stream model
STREAM_GAP_S = 0.1  # seconds between its words: a reply takes about 3 s
GROWING_WORDS = 60  # the reply watched as it grows: about 6 s at that pace
LONG_STREAM_WORDS = 400  # a reply long enough to be stopped midway (about 40 s)


@pytest.fixture(scope="module")
def stream_model():
    from harness.stream_model import StreamModel, stream_model_server

    model = StreamModel(words=STREAM_WORDS, gap_s=STREAM_GAP_S)
    server = stream_model_server(model)
    try:
        yield model, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stream_page(tmp_path_factory, stream_model):
    from harness.stream_model import page_env

    tmp = tmp_path_factory.mktemp("stream-page")
    env = {"AGENT_POLL_INTERVAL_MS": str(POLL_INTERVAL_MS), **page_env(stream_model[1])}
    with page_server(tmp / "data", tmp / "streamlit.log", env) as running:
        yield running


def test_a_reply_is_seen_growing_at_three_lengths_or_more_before_the_turn_is_done(stream_page, stream_model, page):
    from harness.page import WORD_WATCH_JS, word_counts
    from harness.stream_model import word

    model, _ = stream_model
    # The same pace as every reply here (a word every 0.1 s), for 6 s rather than 3: a page that starts following
    # a second late on a machine as busy as the suite's still has the time to show the text growing.
    model.words = GROWING_WORDS
    page.add_init_script(WORD_WATCH_JS)
    last = word(model.next_word + GROWING_WORDS - 1)  # the reply's last word
    ask(page, stream_page.url, "Tell me a long story.")
    page.get_by_text("Writing…").first.wait_for(timeout=30000)  # the text shows while it is written
    wait_settled(page, last, timeout_s=30)
    lengths = [count for _, count in word_counts(page) if 0 < count < GROWING_WORDS]
    assert len(set(lengths)) >= 3, f"partial lengths seen before the whole reply: {lengths}"
    assert lengths == sorted(lengths), "the text only ever grows"


def test_stop_mid_stream_is_acknowledged_at_once_and_ends_the_turn_keeping_what_was_written(stream_page, stream_model,
                                                                                          page):
    from harness.page import STOP_WATCH_JS, WORD_WATCH_JS, stop_times, word_counts

    model, _ = stream_model
    model.words = LONG_STREAM_WORDS
    try:
        page.add_init_script(WORD_WATCH_JS)
        page.add_init_script(STOP_WATCH_JS)
        ask(page, stream_page.url, "Tell me a very long story.")
        page.wait_for_function("() => (window.__wordCounts.at(-1) || [0, 0])[1] >= 3", timeout=30000)
        page.get_by_role("button", name="Stop").click()
        ended_at = wait_settled(page, "Stopped.", timeout_s=30)
        clicked, stopping = stop_times(page)  # "Stopping…" as the page's observer saw it, however briefly
        # Answered by "Stopping…", or by the ending itself when the browser drew both in one go (a busy
        # machine batches the updates) and "Stopping…" never reached the screen.
        acknowledged = stopping or ended_at
        assert clicked is not None and acknowledged >= clicked
        shown = word_counts(page)[-1][1]
        assert 3 <= shown < LONG_STREAM_WORDS, "what was written before Stop stays on screen, and no more"
        assert page.get_by_text("cut off").count() >= 1, "it is shown as a cut-off text, not as the reply"
    finally:
        model.words = STREAM_WORDS


def test_an_idle_tab_sees_a_turn_started_in_another_tab(server, browser):
    first, second = (browser.new_context(viewport={"width": 1280, "height": 1000}) for _ in range(2))
    try:
        one, two = first.new_page(), second.new_page()
        ask(one, server.url, "What is 21*23?")
        one.wait_for_url("**/?c=*", timeout=15000)
        wait_settled(one, "21*23 = 483", timeout_s=30)
        two.goto(one.url)
        wait_settled(two, "21*23 = 483", timeout_s=30)  # the second tab, idle on the same conversation
        two.wait_for_timeout(2000)  # idle for a while: it must still be following, not just fresh

        one.fill(INPUT, "What is 22*23?")
        one.keyboard.press("Enter")
        two.get_by_text("What is 22*23?").first.wait_for(timeout=15000)  # without a reload
        wait_settled(two, "22*23 = 506", timeout_s=30)
    finally:
        first.close()
        second.close()


def test_an_open_tab_whose_conversation_expired_says_so_without_a_reload(server, page):
    from agent.conversation.keys import Keys
    from agent.conversation.store import Store
    from agent.runtime.connection import state_client
    from harness.waiting import wait_for

    ask(page, server.url, "What is 31*23?")
    page.wait_for_url("**/?c=*", timeout=15000)
    wait_settled(page, "31*23 = 713", timeout_s=30)
    cid = page.url.split("c=", 1)[1].split("&", 1)[0]
    client = state_client(server.redis_url())
    try:
        for key in Keys.of(cid).all:  # as Redis expires them after the conversation's TTL
            client.expire(key, 1)
        wait_for(lambda: Store(client, ttl_s=600).read(cid) is None, 10, "the conversation expired")
    finally:
        client.close()
    # The tab sits open and idle; it learns of the loss from its own follower, not from a reload.
    page.get_by_text("The conversation this tab was showing has expired").first.wait_for(timeout=20000)
    page.wait_for_selector(f"{INPUT}:not([disabled])", timeout=10000)  # and a new chat can be sent at once


# Long enough for two tabs to delete the conversation while it runs, on a machine as busy as the suite makes it.
SLOW_TOOL_S = 60


def test_deleting_a_conversation_in_flight_from_another_tab_ends_its_turn_and_the_first_tab_says_so(server, browser):
    from rq.serializers import JSONSerializer

    from agent.conversation.keys import Keys
    from agent.conversation.store import Store
    from agent.queue import SafeJob, job_status
    from agent.runtime.connection import queue_client, state_client
    from harness.waiting import wait_for

    first, second = (browser.new_context(viewport={"width": 1280, "height": 1000}) for _ in range(2))
    client = None
    try:
        one, two = first.new_page(), second.new_page()
        ask(one, server.url, f"Please be slow {SLOW_TOOL_S} seconds, then tell me the time in Paris.")
        one.wait_for_url("**/?c=*", timeout=15000)
        cid = one.url.split("c=", 1)[1].split("&", 1)[0]
        client = state_client(server.redis_url())  # the page's Redis exists once a page has opened
        store = Store(client, ttl_s=600)
        meta = wait_for(lambda: (m := store.read_meta(cid)) and (m["current_step"] or {}).get("kind") == "tool" and m,
                        30, f"the turn runs its {SLOW_TOOL_S} s tool")
        one.get_by_role("button", name="Stop").wait_for(timeout=15000)  # the first tab follows it, in flight

        two.goto(one.url)
        two.get_by_text("This conversation").first.click()  # the sidebar's expander for the open conversation
        two.get_by_role("button", name="Delete…").click()
        two.get_by_text("Its reply in flight is stopped.").first.wait_for(timeout=20000)
        click_until(two.get_by_role("button", name="Delete", exact=True),
                    two.get_by_text("The conversation was deleted. This is a new chat.").first)

        # The first tab, left alone, learns it from its own follower: it says so and offers a new chat.
        one.get_by_text("The conversation this tab was showing was deleted").first.wait_for(timeout=20000)
        one.wait_for_selector(f"{INPUT}:not([disabled])", timeout=10000)
        assert one.get_by_role("button", name="Stop").count() == 0
        assert "c=" not in one.url

        # The worker's turn stopped long before its tool would have ended, and wrote nothing back.
        queue = queue_client(server.redis_url())
        try:
            status = wait_for(lambda: (s := job_status(queue, meta["job_id"])) in ("finished", "failed", None)
                              and (s or "gone"), 15, "the job ended")
            assert status in ("finished", "gone")
            if status == "finished":  # RQ's own stamp of the job's end, not this test's clock after its waits
                ended_at = SafeJob.fetch(meta["job_id"], connection=queue, serializer=JSONSerializer).ended_at
                tool_would_end = meta["current_step"]["started_at"] + SLOW_TOOL_S
                assert ended_at.timestamp() < tool_would_end, "it ended before its tool would"
        finally:
            queue.close()
        assert client.exists(*Keys.of(cid).all) == 0
    finally:
        if client is not None:
            client.close()
        first.close()
        second.close()


# Last: it stops the module's page server the tests above share.
def test_stopping_the_page_stops_its_redis_and_workers(server):
    server.note_redis()
    assert server.leftovers(timeout_s=0), "the pool and Redis ran while the page did"
    server.stop()
    assert server.leftovers() == []
