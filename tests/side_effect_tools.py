"""A tool with a side effect, offered through AGENT_TOOLS=tests.side_effect_tools (tests/test_resume.py).

`record` appends one line "<pid> <note>" to the file SIDE_EFFECT_FILE names, then sleeps (so a test
can kill its worker while it runs). It is not marked idempotent: a resumed turn must not run it again.
"""

from __future__ import annotations

import os
import time

SLEEP_S = 8.0  # seconds the tool sleeps after its side effect (its worker is killed meanwhile)


def record(note: str) -> str:
    """Record a note (once: this has a side effect), then take a while.

    Args:
        note: what to record
    """
    path = os.environ.get("SIDE_EFFECT_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {note}\n")
            f.flush()
            os.fsync(f.fileno())
    time.sleep(SLEEP_S)
    return f"recorded {note}"


TOOLS = [record]
