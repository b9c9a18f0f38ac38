"""The wait tool: slow on purpose, for demonstrations; it honours the deadline and a stop."""

from __future__ import annotations

import threading
import time

from agent.tools.registry import ToolError

MAX_WAIT_S = 600.0  # seconds


def wait(seconds: float, *, timeout_s: float, stop: threading.Event | None = None) -> str:
    """A slow tool for demonstrations: waits the given number of seconds, or until its time limit.

    Args:
        seconds: how long to wait, 0 to 600
    """
    if not 0 <= seconds <= MAX_WAIT_S:  # also refuses NaN
        raise ToolError(f"seconds must be between 0 and {MAX_WAIT_S:g}, not {seconds:g}")
    planned_s = min(seconds, max(0.0, timeout_s))
    started = time.monotonic()
    stopped = (stop or threading.Event()).wait(planned_s)
    waited_s = time.monotonic() - started
    if stopped:
        return f"Waited {waited_s:.1f} of {seconds:g} s: stopped at your request"
    if planned_s < seconds:
        return f"Waited {waited_s:.1f} of {seconds:g} s: stopped at the tool's time limit"
    return f"Waited {waited_s:.1f} s"
