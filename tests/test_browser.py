"""The page end to end: `streamlit run app.py` on its own embedded Redis and workers, driven by
Debian's Chromium through Playwright. Set AGENT_SCREENSHOTS=1 to also refresh docs/screenshots/."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CANARY_KEY, ROOT, alive, processes_with_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402 - only once Chromium is known to exist

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUESTION = "What is 17*23, and what time is it in Tokyo?"
ANSWER = "17*23 = 391"
POLL_INTERVAL_MS = 1000  # the default: a page run (~0.3 s here) must be well inside it
START_TIMEOUT_S = 60
INPUT = 'textarea[data-testid="stChatInputTextArea"]'
AUTOREFRESH = 'iframe[title="streamlit_autorefresh.st_autorefresh"]'
SCREENSHOTS = ROOT / "docs" / "screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PageServer:
    """`streamlit run app.py` in its own session, with a private data dir (its own Redis and pool)."""

    def __init__(self, data_dir: Path, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.data_dir = data_dir
        self.marker = f"browser-{time.time_ns()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "REDIS_URL"))}
        env.update(AGENT_DATA_DIR=str(data_dir), AGENT_POLL_INTERVAL_MS=str(POLL_INTERVAL_MS),
                   AGENT_MODEL="demo@0.8",  # each model call takes 0.8 s, so every step can be seen landing
                   AGENT_WORKERS="2", AGENT_TEST_MARKER=self.marker,
                   OPENAI_API_KEY=CANARY_KEY)  # the sidebar may say a key is set, never show it
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(self.port),
             "--server.address", "127.0.0.1", "--server.headless", "true"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.redis_pid: int | None = None
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"streamlit did not start: {log_path.read_text(errors='replace')[-2000:]}")

    def note_redis(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.redis_pid = int((self.data_dir / "redis.pid").read_text().strip())

    def stop(self) -> None:
        """SIGTERM (Streamlit then runs its atexit handlers: pool and Redis stop), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()

    def leftovers(self, timeout_s: float = 15.0) -> list[int]:
        end = time.monotonic() + timeout_s
        while True:
            left = [p for p in processes_with_env("AGENT_TEST_MARKER", self.marker) if alive(p)]
            if self.redis_pid and alive(self.redis_pid):
                left.append(self.redis_pid)
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.2)

    def kill_leftovers(self) -> None:
        for pid in self.leftovers(timeout_s=0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    page_server = PageServer(tmp / "data", tmp / "streamlit.log")
    try:
        yield page_server
    finally:
        page_server.stop()
        page_server.kill_leftovers()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


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


def quiet_for(sent_at: list[float], quiet_s: float, within_s: float) -> bool:
    """True once no websocket frame was sent for `quiet_s`, waiting at most `within_s`."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        last = sent_at[-1] if sent_at else 0.0
        if time.monotonic() - last >= quiet_s:
            return True
        time.sleep(0.1)
    return False


def test_a_question_shows_each_tool_step_before_the_answer_then_stops_polling(server, page):
    sent_at: list[float] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda _: sent_at.append(time.monotonic())))
    ask(page, server.url, QUESTION)
    server.note_redis()
    page.wait_for_url("**/?c=*", timeout=15000)
    page.wait_for_selector(AUTOREFRESH, state="attached", timeout=15000)  # polling while in flight

    page.get_by_text("calculator(17*23)").first.wait_for(timeout=20000)
    assert page.get_by_text(ANSWER).count() == 0, "the first tool step lands before the answer"
    page.get_by_text("current_time(Asia/Tokyo)").first.wait_for(timeout=20000)
    page.get_by_text(ANSWER).first.wait_for(timeout=20000)
    page.get_by_text("The three clocks for this turn").first.wait_for(timeout=10000)

    # Polling stops once done: the browser asks for no more reruns. (Streamlit may keep the removed
    # component's iframe in the DOM as a hidden, stale node; what matters is that it no longer ticks.)
    assert quiet_for(sent_at, POLL_INTERVAL_MS / 1000 * 5, within_s=10), "reruns go on after done"
    assert page.locator(AUTOREFRESH).count() == 0 or page.locator(f"[data-stale=true] {AUTOREFRESH}").count() == 1
    assert page.locator(INPUT).is_enabled()

    url = page.url
    page.reload()
    page.get_by_text(ANSWER).first.wait_for(timeout=20000)
    assert page.url == url
    page.get_by_text("calculator(17*23)").first.wait_for(timeout=5000)


@pytest.mark.skipif(not os.environ.get("AGENT_SCREENSHOTS"),
                    reason="set AGENT_SCREENSHOTS=1 to refresh the README's screenshots")
def test_screenshots_for_the_readme(server, browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1300, "height": 1950}, device_scale_factor=1)
    page = context.new_page()
    try:
        ask(page, server.url, QUESTION)
        page.get_by_text(ANSWER).first.wait_for(timeout=30000)
        page.wait_for_selector(AUTOREFRESH, state="detached", timeout=10000)
        page.wait_for_timeout(800)
        page.screenshot(path=str(SCREENSHOTS / "chat.png"), full_page=True)

        # The hang scenario on the short demo clocks: it ends timed out, before the deadline.
        page.get_by_role("button", name="New chat").click()
        page.get_by_role("button", name="Demo clocks").click()
        page.get_by_test_id("stSidebar").get_by_test_id("stSelectbox").nth(1).click()  # the scenario
        page.get_by_role("option", name="hang").click()
        page.wait_for_timeout(500)
        page.fill(INPUT, "What is 17*23?")
        page.keyboard.press("Enter")
        page.get_by_text("Ran out of time").first.wait_for(timeout=30000)
        page.wait_for_selector(AUTOREFRESH, state="detached", timeout=10000)
        page.wait_for_timeout(1000)
        page.get_by_test_id("stExpander").filter(has_text="The three clocks").last.screenshot(
            path=str(SCREENSHOTS / "timeline.png"))
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


def test_a_hostile_reply_is_shown_inert_and_no_key_reaches_the_page(server, page):
    from agent.connection import state_client
    from agent.embedded_redis import EmbeddedRedis
    from agent.store import Store

    canary = Canary()
    try:
        hostile = (
            f"<script>window.__pwned = 1; fetch('{canary.url}/script')</script>\n\n"
            f"<img src=x onerror=\"window.__pwned = 2; fetch('{canary.url}/onerror')\">\n\n"
            f"![tracking pixel]({canary.url}/markdown.png)\n\n"
            f"[ref image]: {canary.url}/ref.png\n![ref][ref image]\n\n"
            f"<iframe src=\"{canary.url}/iframe\"></iframe> done"
        )
        page.goto(server.url)
        page.wait_for_selector(INPUT, timeout=START_TIMEOUT_S * 1000)  # the page has started its Redis
        store = Store(state_client(EmbeddedRedis(server.data_dir).url), ttl_s=600)
        cid, turn_id = f"hostile{time.time_ns()}", "t1"
        now = time.time()
        doc = {"status": "running", "job_id": "none", "enqueued_at": now, "started_at": now,
               "deadline_at": now + 100, "job_timeout_at": now + 120}
        store.begin_turn(cid, turn_id, {"role": "user", "content": "say something nasty"}, doc)
        image = f"![pixel]({canary.url}/%s.png)"
        steps = [
            {"turn_id": turn_id, "index": 1, "kind": "tool", "name": image % "tool-name", "started_at": now,
             "ended_at": now + 0.1, "duration_s": 0.1, "timeout_s": 50, "remaining_s": 50, "outcome": "ok",
             "arguments": json.dumps({"q": image % "argument"}), "result": image % "result"},
            {"turn_id": turn_id, "index": 2, "kind": "model", "name": "demo", "started_at": now + 0.1,
             "ended_at": now + 0.2, "duration_s": 0.1, "timeout_s": 50, "remaining_s": 50, "outcome": "error",
             "detail": image % "provider-error", "attempt": 1},
        ]
        store.publish(cid, turn_id, {**doc, "status": "done", "error": None}, done=True,
                      new_messages=[{"role": "assistant", "content": hostile}], new_steps=steps,
                      summary={"turn_id": turn_id, "status": "done", "started_at": now, "deadline_at": now + 100,
                               "job_timeout_at": now + 120, "ended_at": now + 1, "config": {}})
        page.goto(f"{server.url}?c={cid}")
        page.get_by_text("say something nasty").first.wait_for(timeout=20000)
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


def test_stopping_the_page_stops_its_redis_and_workers(server):
    server.note_redis()
    assert server.leftovers(timeout_s=0), "the pool and Redis ran while the page did"
    server.stop()
    assert server.leftovers() == []
