"""From a click on Approve to the tool's step on screen, in Chromium: `python -m bench.approve_click [--runs N]
[--hogs N]`. Prints one JSON object: p50/p95 (ms) of click to step, and its parts (click to the answer taken,
the answer to the tool's step written, that write to the screen), idle or beside CPU hogs.

One `streamlit run app.py` (embedded Redis, two workers, AGENT_APPROVE_TOOLS=calculator); each run opens a
new chat in a fresh browser context, asks a question that makes the model ask for the calculator, waits
until the request is on screen and its countdown has moved (a person reads before clicking: the page is in
its parked state by then), clicks Approve and times the tool's step in the browser (harness/approvals.py).
The browser's and the server's clocks are the same machine's."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from agent.conversation.store import Store
from agent.runtime.connection import state_client
from harness import approvals as seen
from harness.page import chromium, chromium_available, conversation_id, cpu_hogs, open_chat, page_server, send
from harness.stats import summary

RUNS = 10
GOAL_P95_MS = 1000  # idle
PARK_S = 60.0  # seconds from sending to the request on screen, cold page included
STEP_S = 30.0  # seconds from the click to the tool's step before a run gives up


def measure(runs: int, hogs: int, workdir: Path) -> dict:
    """Per run: click to step on screen, and its parts (seconds); then their summaries in ms."""
    rows = []
    with page_server(workdir / "data", workdir / "streamlit.log", seen.PAGE_ENV) as server, chromium() as browser, \
            cpu_hogs(hogs):
        for _ in range(runs):
            rows.append(_one(browser, server))
            server.note_redis()
    parts = ("click_to_step", "click_to_answer", "answer_to_write", "write_to_screen")
    figures = {name: summary([r[name] for r in rows], scale=1000, digits=0) for name in parts}
    return {"runs": runs, "cpu_hogs": hogs, "ms": figures,
            "goal_p95_ms": GOAL_P95_MS, "met": hogs > 0 or (figures["click_to_step"]["p95"] or 0) <= GOAL_P95_MS}


def _one(browser, server) -> dict:
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    try:
        context.add_init_script(seen.WATCH_JS)
        page = context.new_page()
        open_chat(page, server.url)
        send(page, seen.QUESTION)
        cid = conversation_id(page)
        seen.wait_request(page, PARK_S)
        seen.wait_countdown_moves(page, PARK_S)
        page.get_by_role("button", name=seen.APPROVE).click()
        step_at = seen.wait_seen(page, "tool", STEP_S)
        clicked_at = seen.times(page)["clicked"]
        answered_at, written_at = _server_times(server.redis_url(), cid)
        return {"click_to_step": step_at - clicked_at, "click_to_answer": answered_at - clicked_at,
                "answer_to_write": written_at - answered_at, "write_to_screen": step_at - written_at}
    finally:
        context.close()


def _server_times(redis_url: str, cid: str) -> tuple[float, float]:
    """When the answer was taken (the request's answered_at) and when the tool's step was written."""
    client = state_client(redis_url)
    try:
        state = Store(client, ttl_s=600).read(cid)
    finally:
        client.close()
    tool = next(s for s in state["steps"] if s["kind"] == "tool" and s["turn_id"] == state["turn_id"])
    return state["approval"]["answered_at"], tool["ended_at"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs beside the page (e.g. 2)")
    args = parser.parse_args(argv)
    if not chromium_available():
        print("no chromium: nothing measured (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="approve-click-") as workdir:
        print(json.dumps(measure(args.runs, args.hogs, Path(workdir)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
