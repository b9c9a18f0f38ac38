"""Turns of 70 s and more, as a person watches them in Chromium: `streamlit run app.py` on its own embedded
Redis and workers, three tabs at once, each sending its message as soon as its page is up: the *hang* demo
(its first call hangs to its 60 s cap, the retry to the deadline at 75 s), a slow tool (72 s), and a turn
parked for approval (answered after 72 s). A run of the page's follower lasts up to 30 s, so each turn outlives
several of them. Through it all each tab shows the question once and one status panel, and no element stays
marked stale (faded) for longer than Streamlit's own delay before it fades one. Once idle, once beside two
CPU hogs. The only long browser test: a turn must outlive the follower's runs for what it checks to happen."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from agent.ui import follower
from harness import approvals
from harness.page import (
    BUSY_TEXTS,
    SETTLED_JS,
    STALE_MS,
    STALE_WATCH_JS,
    TWICE_MS,
    chromium,
    chromium_available,
    cpu_hogs,
    open_chat,
    page_server,
    send,
    stale_report,
    watch_stale,
)

if not chromium_available():
    pytest.skip("Debian's chromium is not installed (no `chromium` on PATH; `apt-get install chromium`)",
                allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG_S = 72.0  # seconds each turn lasts (or stays parked): past two of the follower's runs
PAGE_ENV = {**approvals.PAGE_ENV, "AGENT_WORKERS": "3", "AGENT_POLL_INTERVAL_MS": "1000"}
HANG_URL = "?scenario=hang&job_timeout=80&margin=5"  # the call cap's 60 s, then a retry until the deadline, 75 s
SLOW_TOOL = f"Please be slow {LONG_S:g} seconds, then tell me the time in Paris."
PARKED = approvals.QUESTION  # the calculator asks first (approvals.PAGE_ENV)
SEND_APART_S = 1.5  # seconds between the three tabs' messages: three clicks at once make three full runs at once
END_S = 60.0  # seconds for a turn to end and its page to settle once it should (a loose bound, on a busy machine)
SCREENSHOT = "/tmp/test_browser_long_turns_{}.png"


@pytest.fixture
def server(tmp_path):
    with page_server(tmp_path / "data", tmp_path / "streamlit.log", PAGE_ENV) as running:
        yield running


@pytest.fixture
def tabs():
    """Three pages, each in a window of its own: in one window, only the front tab renders at full speed."""
    with chromium() as browser:
        contexts = [browser.new_context(viewport={"width": 1280, "height": 1400}) for _ in range(3)]
        try:
            pages = [context.new_page() for context in contexts]
            for page in pages:
                page.add_init_script(STALE_WATCH_JS)
            yield pages
        finally:
            for context in contexts:
                context.close()


def wait_idle(page, timeout_s: float) -> None:
    """The turn has ended and the page settled: nothing of a turn in flight, the input on."""
    page.wait_for_function(SETTLED_JS, arg=["", BUSY_TEXTS], timeout=timeout_s * 1000, polling=100)


def machine_already_busy() -> bool:
    """Inside `make test` (its other processes) or `make test-under-load` (its hogs) the machine is never idle:
    the idle case cannot be run there, and cpu_hogs counts that load towards the busy case's two hogs."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) > 2 or int(os.environ.get("CPU_HOGS_RUNNING") or 0) > 0


@pytest.mark.parametrize("hogs", [0, 2])
def test_turns_longer_than_a_followers_run_leave_no_stale_copy(server, tabs, hogs):
    if hogs == 0 and machine_already_busy():
        pytest.skip("the machine is not idle inside a loaded suite: the case beside two hogs runs instead "
                    "(alone: pytest tests/test_browser_long_turns.py)")
    assert LONG_S > 2 * follower.HOLD_S, "each turn outlives two of the follower's runs"
    hang, slow, parked = tabs
    with cpu_hogs(hogs):
        try:
            # Each message sent at once, as a person who knows what to type does: before the new chat's first
            # idle tick (the first follower run in flight then draws what the idle one would have).
            for page, url, question in ((hang, HANG_URL, "Are you there?"), (slow, "", SLOW_TOOL),
                                        (parked, "", PARKED)):
                open_chat(page, server.url + url)
                send(page, question)
                watch_stale(page, question)
                page.wait_for_timeout(SEND_APART_S * 1000)
            sent_at = time.monotonic()
            approvals.wait_request(parked, END_S)
            parked_for = LONG_S - (time.monotonic() - sent_at)
            parked.wait_for_timeout(max(0.0, parked_for) * 1000)  # the request waits, as a person deciding
            parked.get_by_role("button", name=approvals.APPROVE).click()
            for page in tabs:
                wait_idle(page, END_S)
            assert time.monotonic() - sent_at > LONG_S
            names = ("hang", "slow tool", "parked")
            reports = {name: stale_report(page) for name, page in zip(names, tabs, strict=True)}
        except BaseException:
            for index, page in enumerate(tabs):
                with contextlib.suppress(Exception):
                    page.screenshot(path=SCREENSHOT.format(index), full_page=True)
            raise
    for name, report in reports.items():
        print(f"\n{name} ({hogs} hogs): longest stale {report['staleMs']:.0f} ms ({report['staleText']!r}); the "
              f"question or the status panel twice for {report['twiceMs']:.0f} ms at most (at most "
              f"{report['mostQuestions']} questions, {report['mostPanels']} panels)")
    for name, report in reports.items():
        assert report["staleMs"] < STALE_MS, (name, report["staleMs"], report["staleText"])
        assert report["twiceMs"] < TWICE_MS, (name, report["twiceMs"], report["twiceText"])
    assert "17*23 = 391" in parked.locator("body").inner_text(), "the parked turn was answered"
