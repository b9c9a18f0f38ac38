"""A tool that is not safe to repeat, able to kill or freeze its own worker mid-run; offered through
AGENT_TOOLS=tests.ledger_tools (tests/test_side_effects_once.py, and the fault runner's ledger turns).

`ledger(entry, crash)` appends one line "<idempotency key> <entry> <pid>" to the file LEDGER_FILE names:
a side effect that must happen at most once per tool call, whatever happens to its worker. `crash` (the
test's script asks for it in the call's arguments) ends or freezes the process the tool runs in, which
is the worker, or a forking worker's work horse:

- "kill-before" / "stop-before": SIGKILL / SIGSTOP before the line is written (the call has started);
- "kill-after" / "stop-after": after it is written (the side effect happened; its result is not stored).

A process stopped by "stop-..." first appends "<pid> <idempotency key>" to LEDGER_FILE + ".stopped", so
that the test can wake it (SIGCONT) once the turn was resumed elsewhere.
"""

from __future__ import annotations

import os
import signal

CRASHES = ("", "kill-before", "kill-after", "stop-before", "stop-after")


def ledger(entry: str, crash: str = "", *, idempotency_key: str) -> str:
    """Write one entry to the ledger (a side effect: never run it twice).

    Args:
        entry: what to write
        crash: for tests only: "kill-before", "kill-after", "stop-before" or "stop-after"
    """
    path = os.environ["LEDGER_FILE"]
    if crash not in CRASHES:
        raise ValueError(f"crash must be one of {CRASHES}")
    if crash.endswith("-before"):
        _crash(path, crash, idempotency_key)
    with open(path, "a") as f:
        f.write(f"{idempotency_key} {entry} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())
    if crash.endswith("-after"):
        _crash(path, crash, idempotency_key)
    return f"written: {entry}"


def _crash(path: str, crash: str, key: str) -> None:
    if crash.startswith("stop"):
        with open(path + ".stopped", "a") as f:
            f.write(f"{os.getpid()} {key}\n")
            f.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


TOOLS = [ledger]
