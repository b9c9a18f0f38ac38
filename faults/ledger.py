"""The fault runner's side-effecting tool, offered to its workers through AGENT_TOOLS=faults.ledger.

`ledger(entry, pause_s)` is not safe to repeat: it appends "<idempotency key> <entry>" to the file
LEDGER_FILE names, then takes `pause_s`, so that a reply of a dozen such calls, mixed with quick
tools that are safe to repeat, lasts long enough for a process fault to land inside it. After the
runs, the runner reads the ledger: no key may appear twice (`ledger_problems`).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

MAX_PAUSE_S = 0.5


def ledger(entry: str, pause_s: float = 0.0, *, idempotency_key: str) -> str:
    """Write an entry to the ledger (a side effect: never run it twice).

    Args:
        entry: what to write
        pause_s: seconds to take after writing it, 0 to 0.5
    """
    with open(os.environ["LEDGER_FILE"], "a") as f:
        f.write(f"{idempotency_key} {entry}\n")
        f.flush()
    time.sleep(max(0.0, min(MAX_PAUSE_S, pause_s)))
    return f"written: {entry}"


def read_ledger(path: Path) -> list[tuple[str, str]]:
    """(idempotency key, entry) of every line written."""
    if not path.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines() if " " in line]


def ledger_problems(lines: list[tuple[str, str]]) -> list[str]:
    """Every tool call whose side effect happened more than once."""
    counts = Counter(key for key, _ in lines)
    return [f"the ledger call {key} ran {n} times" for key, n in sorted(counts.items()) if n > 1]


TOOLS = [ledger]
