"""A turn outlives its worker, as a person sees it in the browser: `streamlit run app.py` on its own
embedded Redis and pool of 2 workers, driven by Debian's Chromium through Playwright. The worker running
the turn is SIGKILLed during a (slow, 3 s) model call; the page shows the resume caption in the turn,
then the answer, and settles with no error banner."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from rq import Worker
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.conversation.store import Store
from agent.queue import SafeJob
from agent.runtime.connection import queue_client, state_client
from agent.turn.heartbeat import HEARTBEAT_TTL_S
from harness.page import (
    BUSY_TEXTS,
    chromium,
    chromium_available,
    conversation_id,
    open_chat,
    page_server,
    send,
    wait_settled,
)
from harness.processes import alive
from harness.waiting import wait_for

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is 17*23?"  # two model calls (the calculator's, then the answer's), 3 s each
ANSWER = "17*23 = 391"
PAGE_ENV = {
    "AGENT_POLL_INTERVAL_MS": "1000",  # the default
    "AGENT_MODEL": "demo@3~0",  # each model call takes 3 s and answers in one piece: a kill lands inside one
    "AGENT_WORKERS": "2",
}
SETTLE_S = 0.3  # seconds after the turn is seen running: its job is inside its first model call (3 s) by then
OBSERVE_S = 20.0  # seconds a step of the test may wait for what it then looks at
TURN_S = 60.0  # seconds for the resumed turn to end and the page to settle (the turn's own clocks end it sooner)
CAPTION_WITHIN_S = 10.0  # seconds from the resumed job's first write to the caption on screen: a loose bound
SILENT_WITHIN_S = 2.5  # seconds past the heartbeat's lapse for the page to say so (it looks every second)
SEEN_DEATH_RESUME_S = 1.5  # seconds from a SIGKILL its pool sees to the resumed job's first write (goal 0.5 s)
SCREENSHOT = "/tmp/test_browser_resume.png"

# Installed before the page loads: when the resume caption, and then the answer, were first on screen
# (epoch ms, the browser's clock), and the caption's text; when the status panel first said the worker stopped
# answering, and whether it went back to counting the dead worker's call before the resume.
RESUME_WATCH_JS = """(() => {
    window.__resumeAt = null; window.__resumeText = null; window.__answerAt = null;
    window.__silentAt = null; window.__countedAfterSilent = null; let counted = null;
    const check = () => {
        const now = Date.now();
        const text = document.body.innerText || "";
        // The call being counted, in seconds: the dead worker's, or (once resumed) the new one's, from 0 again.
        const call = text.match(/Calling the model \\([^)]*\\): ([\\d.]+) (ms|s)/);
        const seconds = call ? parseFloat(call[1]) / (call[2] === "ms" ? 1000 : 1) : null;
        if (window.__silentAt === null && text.includes("The worker stopped answering")) window.__silentAt = now;
        if (window.__silentAt === null && seconds !== null) counted = seconds;
        if (window.__silentAt !== null && window.__resumeAt === null && seconds !== null && counted !== null
                && seconds >= counted) window.__countedAfterSilent = call[0];
        if (window.__resumeAt === null) {
            for (const el of document.querySelectorAll('[data-testid="stCaptionContainer"]')) {
                const text = el.innerText || "";
                if (text.includes("Resume 1") && text.includes("worker was lost")) {
                    window.__resumeAt = now; window.__resumeText = text; break;
                }
            }
        }
        if (window.__answerAt === null) {
            for (const el of document.querySelectorAll('[data-testid="stChatMessage"]')) {
                if ((el.innerText || "").includes("__ANSWER__")) { window.__answerAt = now; break; }
            }
        }
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true, characterData: true});
})()""".replace("__ANSWER__", ANSWER)

# In document order: is the resume caption drawn before the answer, inside the same chat message?
ORDER_JS = """([answer]) => {
    for (const message of document.querySelectorAll('[data-testid="stChatMessage"]')) {
        const caption = [...message.querySelectorAll('[data-testid="stCaptionContainer"]')]
            .find((el) => (el.innerText || "").includes("Resume 1"));
        const reply = [...message.querySelectorAll('[data-testid="stMarkdownContainer"]')]
            .find((el) => (el.innerText || "").includes(answer) && !el.closest('[data-testid="stCaptionContainer"]'));
        if (caption && reply) return !!(caption.compareDocumentPosition(reply) & Node.DOCUMENT_POSITION_FOLLOWING);
    }
    return null;
}"""


@pytest.fixture
def server(tmp_path):
    with page_server(tmp_path / "data", tmp_path / "streamlit.log", PAGE_ENV) as running:
        yield running


@pytest.fixture
def page():
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        try:
            yield context.new_page()
        finally:
            context.close()


@contextlib.contextmanager
def redis_clients(url: str):
    state, queue = state_client(url), queue_client(url)
    try:
        yield Store(state, ttl_s=600), queue
    finally:
        state.close()
        queue.close()


def worker_running(connection, cid: str) -> tuple[int, str] | None:
    """(pid, job id) of the live worker running this conversation's turn, as RQ's registry says."""
    for worker in Worker.all(connection=connection, serializer=JSONSerializer):
        job_id = worker.get_current_job_id()
        if not job_id or not worker.pid or not alive(worker.pid):
            continue
        try:
            job = SafeJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
        except NoSuchJobError:
            continue
        if cid in [*(job.args or ()), *(job.kwargs or {}).values()]:
            return worker.pid, job_id
    return None


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_worker_lost_mid_turn_shows_the_resume_then_the_answer(server, page, how):
    """Killed (SIGKILL): the pool sees its worker die and the turn goes on at once. Frozen (SIGSTOP): nothing
    sees it, so the page says the worker stopped answering once it misses its beats, until the lapsed
    heartbeat's resume."""
    page.add_init_script(RESUME_WATCH_JS)
    frozen = []
    try:
        open_chat(page, server.url)
        server.note_redis()
        send(page, QUESTION)
        cid = conversation_id(page)
        with redis_clients(server.redis_url()) as (store, queue_connection):
            first = wait_for(lambda: (s := store.read(cid)) and s["status"] == "running" and not s["done"] and s,
                             OBSERVE_S, "the turn runs")
            pid, job_id = wait_for(lambda: worker_running(queue_connection, cid), OBSERVE_S,
                                   "a worker that runs the turn")
            assert first["attempt"] == 0
            time.sleep(SETTLE_S)  # into its first model call (3 s): not an assertion
            before = store.read(cid)
            assert not before["done"] and not [s for s in before["steps"] if s["turn_id"] == before["turn_id"]
                                               and s["kind"] == "model"], "still inside the first model call"
            killed_at = time.time()
            if how == "killed":
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: not alive(pid), 5, "the killed worker is gone")
            else:
                frozen.append(pid)
                os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: store.read_meta(cid)["version"] > before["version"], OBSERVE_S,
                     "the resumed job's first write")
            first_write_at = time.time()  # polled every 0.05 s: at most that late

            # As a person sees it: the caption, then the answer, the input back, no error banner.
            page.wait_for_function("() => window.__resumeAt !== null", timeout=TURN_S * 1000, polling=50)
            settled_at = wait_settled(page, ANSWER, timeout_s=TURN_S)
            final = store.read(cid)

        resume_at, caption = page.evaluate("() => [window.__resumeAt / 1000, window.__resumeText]")
        silent_at, counted_again = page.evaluate("() => [window.__silentAt, window.__countedAfterSilent]")
        answer_at = page.evaluate("() => window.__answerAt") / 1000
        page.screenshot(path=SCREENSHOT, full_page=True)
        print(f"\nkilled worker {pid} (job {job_id}); resumed job's first write {first_write_at - killed_at:.2f} s "
              f"after the kill; caption visible {resume_at - first_write_at:.2f} s after that write; answer "
              f"{answer_at - resume_at:.2f} s after the caption; settled {settled_at - killed_at:.2f} s after the kill")
        print(f"caption: {caption!r}")
        print("the worker stopped answering: " + (f"{silent_at / 1000 - killed_at:.2f} s after the kill, "
                                                  f"{resume_at - silent_at / 1000:.2f} s before the caption"
                                                  if silent_at else "never said"))

        if how == "killed":  # its supervisor saw it die: the turn went on at once
            assert first_write_at - killed_at < SEEN_DEATH_RESUME_S, f"{first_write_at - killed_at:.2f} s"
        else:
            # Once the frozen worker missed its beats, the page says so instead of counting a call that nobody
            # runs any more, until the resumed job's note.
            assert silent_at is not None, "the page said the worker stopped answering"
            assert killed_at < silent_at / 1000 <= resume_at, (killed_at, silent_at / 1000, resume_at)
            assert silent_at / 1000 - killed_at < HEARTBEAT_TTL_S + SILENT_WITHIN_S
        assert counted_again is None, f"it went back to counting the dead worker's call: {counted_again!r}"

        assert "Resume 1" in caption and "worker was lost" in caption, caption
        assert "during a model call" in caption and "resumed on another worker" in caption, caption
        caption_s = resume_at - first_write_at
        assert caption_s < CAPTION_WITHIN_S, f"the caption showed {caption_s:.1f} s after the resumed job's first write"
        assert answer_at >= resume_at, "the answer is shown after the resume caption"
        assert page.evaluate(ORDER_JS, [ANSWER]) is True, "the caption is drawn above the answer, in the turn"
        captions = page.get_by_test_id("stCaptionContainer").filter(has_text="Resume")
        assert captions.count() == 1, "one resume caption (the clocks chart also names it, as a bar's label)"
        assert page.get_by_test_id("stAlertContentError").count() == 0, page.locator("body").inner_text()[-1500:]
        assert page.get_by_test_id("stException").count() == 0
        body = page.locator("body").inner_text()
        assert not any(b in body for b in BUSY_TEXTS), body[-1500:]
        assert page.locator("textarea[data-testid='stChatInputTextArea']").is_enabled()
        assert final["done"] and final["status"] == "done" and final["attempt"] == 1, (final["status"], final["error"])
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=SCREENSHOT, full_page=True)
        raise
    finally:
        for pid in frozen:  # woken: its writes are refused, and the page server stops it with the rest
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
