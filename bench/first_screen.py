"""The first screen: from opening the page to a chat input that can be typed into, side by side with a
minimal Streamlit chat app (harness/minimal_chat.py) in the same browser and venv, with 50 and 10,000
conversations stored.

Per size: both apps are started afresh (the page as `make run` starts it, agent/ui/launch.py; the minimal
app with `streamlit run`), each opened once (the first page after the start, which pays what its server
left for the first run), then opened again in
turns, A then B then B then A, each time in a fresh browser context (no cache, a new session). The time
is the browser's own: navigation start to the input present and enabled (a MutationObserver).
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

from agent.queue import new_id
from bench.conversations import write_turn
from harness.page import chromium, page_server
from harness.private_redis import PrivateRedis
from harness.stats import summary

SIZES = (50, 10_000)  # conversations stored
OPENS = 6  # warm opens of each app per size, interleaved
READY_TIMEOUT_S = 120  # seconds for one first screen before the benchmark gives up on it
STATE_TTL_S = 3600  # seconds: nothing expires during a run
MINIMAL_APP = "harness/minimal_chat.py"
RATIO_GOAL = 1.3  # the page's first screen, at most this many times the minimal app's (median of the pairs)
# The first page after the start, against the minimal app's: the first person to open the link waits no
# longer than the next (agent/ui/launch.py does before the server answers what that page used to pay).
FIRST_AFTER_START_GOAL = 1.5

# Installed before the page loads: when the chat input was first there and enabled (ms since navigation start).
READY_JS = """(() => {
    window.__inputReadyMs = null;
    const check = () => {
        const input = document.querySelector('textarea[data-testid="stChatInputTextArea"]');
        if (window.__inputReadyMs === null && input && !input.disabled) window.__inputReadyMs = performance.now();
    };
    new MutationObserver(check).observe(document, {subtree: true, childList: true, attributes: true});
})()"""


def first_screen(sizes: tuple[int, ...], opens: int, workdir: Path, progress) -> dict:
    """Per size: the page's and the minimal app's first screens (ms), and their ratios."""
    rows = []
    for size in sizes:
        progress(f"first screen with {size:,} conversations stored: page against a minimal chat app")
        rows.append(_size(size, opens, workdir / f"first-screen-{size}"))
    return {"opens": opens, "rows": rows}


def _size(size: int, opens: int, directory: Path) -> dict:
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    # The page's embedded Redis is this one: it attaches to the server running on its data dir.
    with PrivateRedis(data, state_ttl_s=STATE_TTL_S) as stored:
        for index in range(size):
            write_turn(stored.store, new_id(), index)
        with contextlib.ExitStack() as stack:
            page = stack.enter_context(page_server(data, directory / "page.log", {"AGENT_STATE_TTL": str(STATE_TTL_S)}))
            minimal = stack.enter_context(page_server(directory / "minimal-data", directory / "minimal.log",
                                                      script=MINIMAL_APP))
            browser = stack.enter_context(chromium())
            apps = {"page": page.url, "minimal": minimal.url}
            first = {name: _ready_ms(browser, url) for name, url in apps.items()}
            times: dict[str, list[float]] = {name: [] for name in apps}
            ratios = []
            for n in range(opens):
                order = list(apps) if n % 2 == 0 else list(apps)[::-1]
                pair = {name: _ready_ms(browser, apps[name]) for name in order}
                for name, ms in pair.items():
                    times[name].append(ms)
                ratios.append(pair["page"] / pair["minimal"])
    return {
        "conversations": size,
        "first_after_start_ms": {name: round(ms) for name, ms in first.items()},
        "first_after_start_ratio": round(first["page"] / first["minimal"], 2),
        "page_ms": summary(times["page"], digits=0),
        "minimal_ms": summary(times["minimal"], digits=0),
        "ratio": summary(ratios, digits=2),
        "ratio_of_medians": round(statistics.median(times["page"]) / statistics.median(times["minimal"]), 2),
    }


def _ready_ms(browser, url: str) -> float:
    """One first screen in a fresh context: navigation start to the chat input enabled (ms)."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    try:
        context.add_init_script(READY_JS)
        page = context.new_page()
        page.goto(url)
        page.wait_for_function("() => window.__inputReadyMs !== null", timeout=READY_TIMEOUT_S * 1000, polling=50)
        return page.evaluate("() => window.__inputReadyMs")
    finally:
        context.close()
