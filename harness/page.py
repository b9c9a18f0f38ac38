"""The page as a person uses it: `streamlit run app.py` on its own embedded Redis and workers,
Debian's Chromium driven by Playwright, CPU hogs for a busy machine, and a chat driver that
measures what each rerun costs and how long the page takes to settle after a turn's final write.

Shared by the browser tests and the bench's page figures. Everything started here is stopped by the
context managers, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness.processes import alive, kill, processes_with_env

ROOT = Path(__file__).resolve().parent.parent  # the project, where `app.py` is
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REBOUND_HOST = "rebound.test"  # a name this browser resolves to 127.0.0.1, as a DNS-rebinding attacker's would
CHROMIUM_ARGS = [f"--host-resolver-rules=MAP {REBOUND_HOST} 127.0.0.1",
                 "--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_TIMEOUT_S = 60  # seconds for `streamlit run` to answer its health check
STOP_TIMEOUT_S = 30  # seconds for Streamlit to stop its pool and Redis after SIGTERM
INPUT = 'textarea[data-testid="stChatInputTextArea"]'
AUTOREFRESH = 'iframe[title="streamlit_autorefresh.st_autorefresh"]'

# What the page shows only while a turn is in flight (the in-flight box, the text being written, Stop's answer).
BUSY_TEXTS = ["Working on it", "Waiting for a worker", "Writing…", "Stopping…", "The worker stopped answering"]

# True once the page has settled after a turn: the expected text is on screen, nothing of a turn in
# flight is left (live or stale), and the chat input is enabled. Returns the browser's clock (epoch ms).
SETTLED_JS = """([expected, busy]) => {
    const input = document.querySelector('textarea[data-testid="stChatInputTextArea"]');
    const text = document.body.innerText;
    const shown = text.includes(expected) && !busy.some((b) => text.includes(b));
    return shown && input && !input.disabled ? Date.now() : false;
}"""

# Installed before the page loads: when each word of the stream model (w0001 ...) was first on screen,
# and each change in how many of them the newest chat message shows, on the browser's clock (epoch ms).
WORD_WATCH_JS = """(() => {
    window.__wordSeen = {};
    window.__wordCounts = [];
    let last = -1;
    const check = () => {
        const messages = document.querySelectorAll('[data-testid="stChatMessage"]');
        if (!messages.length) return;
        const words = (messages[messages.length - 1].innerText || "").match(/\\bw\\d{4}\\b/g) || [];
        const now = Date.now();
        for (const word of words) if (!(word in window.__wordSeen)) window.__wordSeen[word] = now;
        if (words.length !== last) { last = words.length; window.__wordCounts.push([now, words.length]); }
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true, characterData: true});
})()"""

# Installed before the page loads: when Stop was clicked and when "Stopping…" first showed (epoch ms).
STOP_WATCH_JS = """(() => {
    window.__stopClickedAt = null;
    window.__stoppingAt = null;
    document.addEventListener("click", (event) => {
        const button = event.target.closest("button");
        if (button && button.innerText.includes("Stop") && window.__stopClickedAt === null) {
            window.__stopClickedAt = Date.now();
        }
    }, true);
    new MutationObserver(() => {
        if (window.__stopClickedAt !== null && window.__stoppingAt === null
                && document.body.innerText.includes("Stopping…")) window.__stoppingAt = Date.now();
    }).observe(document, {subtree: true, childList: true, characterData: true});
})()"""


# Installed in the page before it loads: records every moment the chat input is enabled while a
# live (not stale) "in flight" box is on screen, which would let a second message race the first.
OVERLAP_WATCH_JS = """(() => {
    window.__inputOpenWhileBusy = [];
    const busy = ["Working on it", "Waiting for a worker"];
    const check = () => {
        const input = document.querySelector('textarea[data-testid="stChatInputTextArea"]');
        if (!input || input.disabled) return;
        for (const el of document.querySelectorAll('[data-testid="stMarkdownContainer"]')) {
            if (el.closest('[data-stale="true"]')) continue;
            const text = el.innerText || "";
            if (busy.some((b) => text.includes(b))) { window.__inputOpenWhileBusy.push(text.slice(0, 80)); return; }
        }
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true, attributes: true});
})()"""


# Installed before the page loads: how long each element on screen was marked stale (Streamlit's
# data-stale="true", which it fades after 0.5 s), the longest with its place and text; and how long the page
# showed the question twice or more, or two status panels or more (a panel with its bars, the time and the
# money, or a parked turn's panel),
# the longest each, with the page's text then. An st.empty is marked stale whenever a run is under way, by
# design, and never shown (display: none): only elements that take up room on the page count.
STALE_WATCH_JS = """(() => {
    const watch = window.__staleWatch = {question: null, staleMs: 0, staleText: null, twiceMs: 0, twiceText: null,
                                         mostQuestions: 0, mostPanels: 0};
    const open = new Map();
    let twiceSince = null, twiceText = null;
    const textOf = (el) => {
        const inner = el.querySelector('[data-testid]');
        const what = inner ? inner.getAttribute('data-testid') : el.className;
        return `${what}: ${(el.innerText || el.textContent || '').slice(0, 100).replace(/\\s+/g, ' ')}`;
    };
    const close = (el, entry, now) => {
        if (now - entry.since > watch.staleMs) { watch.staleMs = now - entry.since; watch.staleText = entry.text; }
        open.delete(el);
    };
    const scan = () => {
        const now = performance.now();
        const stale = new Set([...document.querySelectorAll('[data-stale="true"]')]
            .filter((el) => el.getClientRects().length > 0));
        for (const el of stale) if (!open.has(el)) open.set(el, {since: now, text: textOf(el)});
        for (const [el, entry] of open) if (!stale.has(el)) close(el, entry, now);
        if (!watch.question) return;
        const questions = [...document.querySelectorAll('[data-testid="stChatMessage"]')]
            .filter((m) => (m.innerText || '').includes(watch.question)).length;
        // A status panel holds the time bar and, beside it, the money bar: its bars share their nearest block.
        const panels = new Set([...document.querySelectorAll('[data-testid="stProgress"]')]
            .map((bar) => bar.closest('[data-testid="stVerticalBlock"]') || bar)).size
            + [...document.querySelectorAll('[data-testid="stMarkdownContainer"]')]
                .filter((m) => (m.innerText || '').startsWith('✋ Waiting for your approval')).length;
        watch.mostQuestions = Math.max(watch.mostQuestions, questions);
        watch.mostPanels = Math.max(watch.mostPanels, panels);
        const twice = questions > 1 || panels > 1;
        if (twice && twiceSince === null) {
            twiceSince = now;
            twiceText = `${questions} questions, ${panels} panels: ${document.body.innerText.slice(-2000)}`;
        }
        if (!twice && twiceSince !== null) {
            if (now - twiceSince > watch.twiceMs) { watch.twiceMs = now - twiceSince; watch.twiceText = twiceText; }
            twiceSince = null;
        }
    };
    new MutationObserver(scan).observe(document, {subtree: true, childList: true, characterData: true,
                                                  attributes: true, attributeFilter: ['data-stale']});
    watch.report = () => {
        scan();
        const now = performance.now();
        for (const [el, entry] of [...open]) close(el, entry, now);
        if (twiceSince !== null && now - twiceSince > watch.twiceMs) {
            watch.twiceMs = now - twiceSince; watch.twiceText = twiceText;
        }
        const {staleMs, staleText, twiceMs, twiceText: text, mostQuestions, mostPanels} = watch;
        return {staleMs, staleText, twiceMs, twiceText: text, mostQuestions, mostPanels};
    };
})()"""


def chromium_available() -> bool:
    return Path(CHROMIUM).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PageServer:
    """`streamlit run app.py` (or another `script`) in its own session, with a private data dir (its own
    Redis and pool); on `port` when given (a port some setting names before the page starts), else a free one."""

    def __init__(self, data_dir: Path, log_path: Path, env: dict[str, str] | None = None, script: str = "app.py",
                 port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.data_dir = data_dir
        self.log_path = log_path
        self.marker = f"page-{time.time_ns()}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "REDIS_URL"))}
        full_env.update(AGENT_DATA_DIR=str(data_dir), AGENT_WORKERS="2", AGENT_TEST_MARKER=self.marker,
                        AGENT_MCP_CONFIG="off")
        full_env.update(env or {})
        log_path.parent.mkdir(parents=True, exist_ok=True)  # a bench's work folder, made here for each server in it
        self.log = open(log_path, "ab")
        # The page as `make run` starts it (agent/ui/launch.py: its services and imports ready before the
        # server answers); another script as `streamlit run` does.
        command = ["-m", "agent.ui.launch"] if script == "app.py" else ["-m", "streamlit", "run", script]
        self.proc = subprocess.Popen(
            [sys.executable, *command, "--server.port", str(self.port),
             "--server.address", "127.0.0.1", "--server.headless", "true"],
            cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
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

    def redis_url(self) -> str:
        """The page's own embedded Redis (it exists once the page has been opened)."""
        from agent.runtime.embedded_redis import EmbeddedRedis

        return EmbeddedRedis(self.data_dir).url

    def note_redis(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.redis_pid = int((self.data_dir / "redis.pid").read_text().strip())

    def stop(self) -> None:
        """SIGTERM (Streamlit then runs its atexit handlers: pool and Redis stop), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()

    def leftovers(self, timeout_s: float = 15.0) -> list[int]:
        end = time.monotonic() + timeout_s
        while True:
            left = processes_with_env("AGENT_TEST_MARKER", self.marker)
            if self.redis_pid and alive(self.redis_pid):
                left.append(self.redis_pid)
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.2)

    def kill_leftovers(self) -> None:
        kill(self.leftovers(timeout_s=0))


@contextlib.contextmanager
def page_server(data_dir: Path, log_path: Path, env: dict[str, str] | None = None, script: str = "app.py",
                port: int | None = None):
    server = PageServer(data_dir, log_path, env, script, port)
    try:
        yield server
    finally:
        server.note_redis()
        server.stop()
        server.kill_leftovers()


HOG_LOOP = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def cpu_hogs(count: int):
    """`count` busy loops, one process each, for a machine as busy as a shared demo laptop.

    Under `make test-under-load` its hogs count towards `count` (CPU_HOGS_RUNNING), and so do the
    suite's other pytest-xdist processes under `make test` (each runs tests, as busy as a hog), so a
    test asks for the load it means, not that load on top of the suite's own."""
    peers = max(0, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) - 1)
    count = max(0, count - int(os.environ.get("CPU_HOGS_RUNNING") or 0) - peers)
    # Each loop also ends by itself once this process is gone (a test run killed outright runs no finally).
    procs = [subprocess.Popen([sys.executable, "-c", HOG_LOOP, str(os.getpid())], stdin=subprocess.DEVNULL,
                              start_new_session=True) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)


@dataclass
class Run:
    """One script run as the browser saw it, from its new_session message to its script_finished."""

    run_id: str
    fragment: bool  # a fragment rerun (a poll) rather than a full run
    started_at: float  # monotonic seconds
    first_delta_at: float | None = None  # the first element drawn: the poll (and its wait) is over
    last_delta_at: float | None = None  # the last element drawn: a tick may listen on after it
    finished_at: float | None = None
    bytes_received: int = 0
    drawn_at: float | None = None  # a fragment run's first drawing done (its first component: the poller)
    drawn_bytes: int | None = None  # bytes received up to then
    update_bytes: list[int] = field(default_factory=list)  # each element redrawn after that, while following

    @property
    def duration_s(self) -> float | None:
        """Start to end of the run, a poll's wait for the next write included."""
        return None if self.finished_at is None else self.finished_at - self.started_at

    @property
    def draw_s(self) -> float | None:
        """What the rerun's drawing costs: first element to last, or for a fragment run that follows the
        turn, first element to its first component (what it draws before it starts following)."""
        if self.finished_at is None or self.first_delta_at is None:
            return None
        return (self.drawn_at or self.last_delta_at or self.finished_at) - self.first_delta_at

    @property
    def draw_bytes(self) -> int:
        return self.bytes_received if self.drawn_bytes is None else self.drawn_bytes


@dataclass
class WireLog:
    """Every script run on the page's websocket: when it started and ended, and the bytes it sent."""

    runs: list[Run] = field(default_factory=list)

    def attach(self, page) -> None:
        page.on("websocket", self._on_socket)

    def _on_socket(self, ws) -> None:
        if "_stcore/stream" in ws.url:
            ws.on("framereceived", self._received)

    def _received(self, payload) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        if not isinstance(payload, bytes):
            return
        msg = ForwardMsg()
        try:
            msg.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a frame this log cannot read is not a run boundary
            return
        kind, now = msg.WhichOneof("type"), time.monotonic()
        run_meta = msg.metadata.run
        if kind == "new_session" and run_meta.script_run_id:
            self.runs.append(Run(run_meta.script_run_id, bool(run_meta.fragment_ids), now))
        current = self.runs[-1] if self.runs else None
        if current is None or current.finished_at is not None:
            return
        current.bytes_received += len(payload)
        if kind == "delta":
            current.first_delta_at = current.first_delta_at or now
            current.last_delta_at = now
            if current.drawn_at is not None:
                current.update_bytes.append(len(payload))
            elif msg.delta.new_element.WhichOneof("type") == "component_instance":
                current.drawn_at, current.drawn_bytes = now, current.bytes_received
        elif kind == "script_finished" and run_meta.script_run_id == current.run_id:
            current.finished_at = now

    def finished(self, since: int = 0, *, fragment: bool) -> list[Run]:
        return [r for r in self.runs[since:] if r.fragment is fragment and r.finished_at is not None]


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_chat(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(INPUT, timeout=START_TIMEOUT_S * 1000)


def send(page, text: str, timeout_s: float = 30) -> None:
    """Type a message and press Enter once the input is enabled (the previous turn settled)."""
    page.wait_for_selector(f"{INPUT}:not([disabled])", timeout=timeout_s * 1000)
    page.fill(INPUT, text)
    page.keyboard.press("Enter")


def wait_settled(page, expected: str, timeout_s: float) -> float:
    """Wait until the page has settled showing `expected`; returns when it did (epoch seconds)."""
    handle = page.wait_for_function(SETTLED_JS, arg=[expected, BUSY_TEXTS], timeout=timeout_s * 1000, polling=50)
    return handle.json_value() / 1000


def word_counts(page) -> list[tuple[float, int]]:
    """(epoch seconds, how many stream-model words the newest message showed), each time that changed."""
    return [(at / 1000, count) for at, count in page.evaluate("() => window.__wordCounts")]


def words_seen(page) -> dict[str, float]:
    """Each stream-model word and when it was first on screen (epoch seconds)."""
    return {w: at / 1000 for w, at in page.evaluate("() => window.__wordSeen").items()}


def stop_times(page) -> tuple[float | None, float | None]:
    """When Stop was clicked and when "Stopping…" first showed (epoch seconds), as the browser saw them."""
    clicked, stopping = page.evaluate("() => [window.__stopClickedAt, window.__stoppingAt]")
    return (clicked / 1000 if clicked else None), (stopping / 1000 if stopping else None)


def final_write_at(redis_url: str, conversation_id: str) -> float:
    """When the turn's done write landed (the state's updated_at, epoch seconds)."""
    from agent.conversation.store import Store
    from agent.runtime.connection import state_client

    client = state_client(redis_url)
    try:
        state = Store(client, ttl_s=600).read_meta(conversation_id)
    finally:
        client.close()
    if state is None or not state["done"]:
        raise AssertionError(f"the turn has not ended: {state}")
    return state["updated_at"]


def watch_stale(page, question: str) -> None:
    """From now on, count the chat messages that show `question` and the status panels (STALE_WATCH_JS,
    installed before the page loaded)."""
    page.evaluate("(q) => { window.__staleWatch.question = q; }", question)


# The longest an element may stay faded on screen. Every run marks the elements it will draw again stale until it
# has drawn them (a click marks them all at once): on this shared two-core machine, a full run reached the last of
# them (the sidebar's) up to 2.2 s later. What a run left behind it stayed stale for as long as a run held: 30 s and
# more (the frozen copy of a turn), or 4.2-4.5 s (what a full run left while it followed the turn it had drawn).
STALE_MS = 2500.0
# The longest the question or the status panel may show twice. A full run that moves the turn between two places
# (the chat, the follower's frame) empties one and fills the other one after the other: up to 0.15 s apart, seen
# here. A copy left over lasted seconds.
TWICE_MS = 1000.0


def stale_report(page) -> dict:
    """What STALE_WATCH_JS saw: the longest time an element on screen was marked stale (ms, and its text), the
    longest time the question or the status panel showed twice or more (ms, and the page then), and the most of
    each at once. What is still stale or twice now is counted up to now."""
    return page.evaluate("() => window.__staleWatch.report()")


def conversation_id(page) -> str:
    page.wait_for_url("**/?c=*", timeout=15000)
    return page.url.split("c=", 1)[1].split("&", 1)[0]
