"""The page in headless Chromium: what one poll (a tick) costs and how soon the page settles after a
turn's final write, against the conversation's length, on an idle machine and beside CPU hogs.

Each condition runs its own `streamlit run app.py` (embedded Redis, two workers, the demo model).
Earlier turns are written through the same queue and workers with an instant model, then the page
is reloaded on the conversation and a few turns are asked in the browser, as a person would.
"""

from __future__ import annotations

from pathlib import Path

from agent.queue import get_queue, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.settings import Settings
from agent.store import Store
from harness.follow import states
from harness.page import (
    WireLog,
    chromium,
    chromium_available,
    conversation_id,
    cpu_hogs,
    final_write_at,
    open_chat,
    page_server,
    send,
    wait_settled,
)
from harness.stats import summary

PAGE_MODEL = "demo@1~0"  # one second per model call: a measured turn (3 calls) spans several ticks
POLL_INTERVAL_MS = 1000  # AGENT_POLL_INTERVAL_MS's default
SETTLE_TIMEOUT_S = 90  # seconds for one turn to settle before the benchmark gives up on it
PREPARE_TIMEOUT_S = 30  # seconds for one earlier turn (instant model) to end
PREPARE_WAIT_S = 0.5  # seconds each wait for that turn's next write may take
STATE_TTL_S = 3600  # seconds: nothing expires during a run


def question(n: int) -> tuple[str, str]:
    return f"What is {n}*37, and what time is it in Tokyo?", f"{n}*37 = {n * 37}"


def page_cost(lengths: tuple[int, ...], turns_per_length: int, hogs: tuple[int, ...], workdir: Path,
              progress) -> dict | None:
    """Per condition (number of CPU hogs) and conversation length: tick and settle figures."""
    if not chromium_available():
        progress("no chromium: the page section is skipped (apt-get install chromium)")
        return None
    conditions = {}
    for count in hogs:
        label = f"{count} CPU hogs" if count else "idle"
        progress(f"page in Chromium, {label}: lengths {', '.join(map(str, lengths))}")
        conditions[label] = _condition(lengths, turns_per_length, count, workdir / f"hogs-{count}")
    return {"lengths": list(lengths), "turns_per_length": turns_per_length, "conditions": conditions}


def _condition(lengths: tuple[int, ...], turns_per_length: int, hog_count: int, directory: Path) -> list[dict]:
    directory.mkdir(parents=True, exist_ok=True)
    env = {"AGENT_MODEL": PAGE_MODEL, "AGENT_POLL_INTERVAL_MS": str(POLL_INTERVAL_MS),
           "AGENT_STATE_TTL": str(STATE_TTL_S)}
    rows = []
    with page_server(directory / "data", directory / "streamlit.log", env) as server, chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
        wire = WireLog()
        wire.attach(page)
        open_chat(page, server.url)
        url = server.redis_url()
        store, queue = Store(state_client(url), STATE_TTL_S), get_queue(queue_client(url))
        instant = Settings.from_env({}).turn.with_changes(model="demo@0.05~0")
        cid, made = None, 0
        with cpu_hogs(hog_count):
            for length in lengths:
                while cid and made < length - 1:  # earlier turns, through the queue, instantly
                    made += 1
                    _ask_directly(store, queue, cid, question(made)[0], instant)
                if cid:
                    open_chat(page, f"{server.url}?c={cid}")  # a fresh page on the longer conversation
                settle, draws, sizes, full_runs = [], [], [], []
                for _ in range(turns_per_length):
                    made += 1
                    text, answer = question(made)
                    mark = len(wire.runs)
                    send(page, text, timeout_s=SETTLE_TIMEOUT_S)
                    cid = cid or conversation_id(page)
                    settled_at = wait_settled(page, answer, timeout_s=SETTLE_TIMEOUT_S)
                    settle.append(settled_at - final_write_at(url, cid))
                    ticks = [r for r in wire.finished(mark, fragment=True) if r.draw_s is not None]
                    draws += [r.draw_s for r in ticks]
                    sizes += [r.bytes_received for r in ticks]
                    full_runs += [r.duration_s for r in wire.finished(mark, fragment=False)]
                rows.append({
                    "turns": length,
                    "tick_draw_ms": summary(draws, scale=1000),
                    "tick_bytes": summary(sizes, digits=0),
                    "full_run_ms": summary(full_runs, scale=1000),
                    "settle_s": summary(settle, digits=2),
                })
        store.redis.close()
    return rows


def _ask_directly(store: Store, queue, cid: str, text: str, config) -> None:
    submit_turn(store, queue, cid, text, config)
    for state in states(store, cid, timeout_s=PREPARE_TIMEOUT_S, event_driven=True, interval_s=PREPARE_WAIT_S):
        if state is not None and state["done"]:
            return
    raise RuntimeError(f"an earlier turn did not end within {PREPARE_TIMEOUT_S} s")


def growth(section: dict, condition: str, figure: str) -> float | None:
    """p50 at the longest conversation over p50 at the shortest, for one condition."""
    rows = section["conditions"].get(condition) or []
    if len(rows) < 2 or not rows[0][figure]["p50"] or rows[-1][figure]["p50"] is None:
        return None
    return round(rows[-1][figure]["p50"] / rows[0][figure]["p50"], 3)
