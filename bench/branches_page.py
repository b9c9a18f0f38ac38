"""Branches on the page, in Chromium: `python -m bench.branches_page [--switches N] [--pairs N] [--hogs N]`.
Prints one JSON object.

- switch_ms: from a click on ‹ or › to the other branch on screen (its place "k / 2" shown, and the other
  branch's question gone from the chat, not left faded), p50/p95; goal p95 ≤ 300 ms idle, ≤ 1 s beside two
  CPU hogs.
- first_word_ms: from a click on Regenerate to the first word of the new answer on screen, against a new
  message (Enter pressed) in the same conversation, alternately; goal: regenerate / message ≤ 1.1 (p50s).

One `streamlit run app.py` (embedded Redis, two workers) against the scripted model on loopback
(harness/stream_model.py: each reply its own numbered words, so the first word of a new answer names it). Times
are the browser's clock: the click (or the Enter) from a capturing listener, before Streamlit sees it; the screen
from a check every 10 ms (`wait_for_function`)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from agent.ui.render import RECENT_TURNS
from harness.page import chromium, chromium_available, cpu_hogs, open_chat, page_server, send, wait_settled
from harness.stats import summary
from harness.stream_model import StreamModel, page_env, stream_model_server, word

SWITCHES = 20  # clicks on ‹ or ›, per condition
PAIRS = 8  # (a new message, a regenerate) pairs: 5 gave 0.84x and 1.26x beside two hogs in two runs; at most
# RECENT_TURNS - 2, so the first turn (whose branches the switches flip) is still drawn
WORDS = 8  # words per reply
WORD_GAP_S = 0.1
SWITCH_GOAL_P95_MS = {0: 300, 2: 1000}
RATIO_GOAL = 1.1
TURN_S = 90.0  # seconds for a turn to settle before the run gives up
SEEN_S = 30.0

# Installed before the page loads: when a button was last clicked, or Enter last pressed (epoch ms).
ACT_WATCH_JS = """(() => {
    window.__actAt = null;
    document.addEventListener("click", (e) => { if (e.target.closest("button")) window.__actAt = Date.now(); }, true);
    document.addEventListener("keydown", (e) => { if (e.key === "Enter") window.__actAt = Date.now(); }, true);
})()"""
CHAT_TEXT_JS = "[...document.querySelectorAll('[data-testid=\"stChatMessage\"]')].map((m) => m.innerText).join('\\n')"
SHOWN_JS = f"""([shown, gone]) => {{
    const text = {CHAT_TEXT_JS};
    return text.includes(shown) && !text.includes(gone) ? Date.now() : false;
}}"""

# No element on screen marked stale (faded); an empty placeholder is marked so during any run, and never shown.
NOTHING_FADED_JS = ("() => ![...document.querySelectorAll('[data-stale=\"true\"]')]"
                    ".some((el) => el.getClientRects().length > 0)")

FIRST, EDITED = "Tell me a story.", "Tell me another story."


def _seen(page, shown: str, gone: str = "\u0000") -> float:
    """When `shown` was first in the chat with `gone` out of it (epoch seconds, the browser's clock)."""
    handle = page.wait_for_function(SHOWN_JS, arg=[shown, gone], timeout=SEEN_S * 1000, polling=10)
    return handle.json_value() / 1000


def _act(page, do) -> float:
    page.evaluate("() => { window.__actAt = null; }")
    do()
    page.wait_for_function("() => window.__actAt", timeout=SEEN_S * 1000)
    return page.evaluate("() => window.__actAt") / 1000


def _settle(page, model: StreamModel, first: int) -> None:
    wait_settled(page, word(first + WORDS - 1), TURN_S)


def measure(switches: int, pairs: int, hogs: int, workdir: Path) -> dict:
    if pairs > RECENT_TURNS - 2:
        raise ValueError(f"at most {RECENT_TURNS - 2} pairs: past them the page draws the first turn, whose branches "
                         "the switches flip, behind its 'Show earlier turns' button")
    model = StreamModel(words=WORDS, gap_s=WORD_GAP_S)
    model_server = stream_model_server(model)
    try:
        with page_server(workdir / "data", workdir / "streamlit.log", page_env(model_server)) as server, \
                chromium() as browser:
            context = browser.new_context(viewport={"width": 1280, "height": 1200})
            context.add_init_script(ACT_WATCH_JS)
            try:
                page = context.new_page()
                with cpu_hogs(hogs):
                    figures = _run(page, server.url, model, switches, pairs)
                server.note_redis()
            finally:
                context.close()
    finally:
        model_server.stop()
    switch = summary(figures["switch"], scale=1000, digits=0)
    message, regenerate = (summary(figures[k], scale=1000, digits=0) for k in ("message", "regenerate"))
    ratio = round(regenerate["p50"] / message["p50"], 2) if message["p50"] else None
    goal_ms = SWITCH_GOAL_P95_MS.get(hogs)
    return {"cpu_hogs": hogs, "switch_ms": switch, "switches": len(figures["switch"]),
            "switch_goal_p95_ms": goal_ms, "switch_met": goal_ms is not None and (switch["p95"] or 0) <= goal_ms,
            "first_word_ms": {"message": message, "regenerate": regenerate}, "pairs": pairs,
            "regenerate_over_message": ratio, "ratio_goal": RATIO_GOAL,
            "ratio_met": ratio is not None and ratio <= RATIO_GOAL}


def _run(page, url: str, model: StreamModel, switches: int, pairs: int) -> dict:
    open_chat(page, url)
    figures = {"message": [], "regenerate": [], "switch": []}
    first = model.next_word
    send(page, FIRST)
    _settle(page, model, first)
    for n in range(pairs):  # a new message, then a regenerate of its answer, in the same conversation
        first = model.next_word
        at = _act(page, lambda n=n: send(page, f"And then, part {n + 1}?"))
        figures["message"].append(_seen(page, word(first)) - at)
        _settle(page, model, first)
        first = model.next_word
        at = _act(page, lambda: page.get_by_role("button", name="🔄 Regenerate", exact=True).last.click())
        figures["regenerate"].append(_seen(page, word(first)) - at)
        _settle(page, model, first)
    # Two branches at the first turn: the first question, and an edit of it.
    first = model.next_word
    page.get_by_role("button", name="✏️ Edit", exact=True).first.click()
    editor = page.get_by_label("Edit your message")
    editor.wait_for(timeout=SEEN_S * 1000)
    editor.fill(EDITED)
    page.get_by_role("button", name="Send", exact=True).click()
    _settle(page, model, first)
    _seen(page, "2 / 2")
    shown, other = (EDITED, FIRST), (FIRST, EDITED)
    for n in range(switches):
        name, target, (want, gone) = ("‹", "1 / 2", other) if n % 2 == 0 else ("›", "2 / 2", shown)
        at = _act(page, lambda name=name: page.get_by_role("button", name=name, exact=True).first.click())
        seen_at = max(_seen(page, target), _seen(page, want, gone))
        figures["switch"].append(seen_at - at)
        page.wait_for_function(NOTHING_FADED_JS, timeout=SEEN_S * 1000)  # the page at rest before the next click
    return figures


def goals(section: dict) -> dict[str, bool]:
    """The issue's goals: the switch's p95 idle and beside two hogs, and Regenerate's first word against a message's."""
    return {f"branch_switch_p95_hogs_{hogs}": row["switch_met"] for hogs, row in
            ((int(k.split("_")[1]), v) for k, v in section.items())} | {
        "regenerate_first_word_ratio": all(row["ratio_met"] for row in section.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", type=int, default=SWITCHES)
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs beside the page (e.g. 2)")
    args = parser.parse_args(argv)
    if not chromium_available():
        print("no chromium: nothing measured (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="branches-page-") as workdir:
        print(json.dumps(measure(args.switches, args.pairs, args.hogs, Path(workdir)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
