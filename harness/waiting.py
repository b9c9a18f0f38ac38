"""Waiting for an event by polling: the one loop tests and tools use instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

POLL_S = 0.05  # seconds between looks; short next to every timeout it serves

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str = "the condition", poll_s: float = POLL_S) -> T:
    """The predicate's first truthy value; AssertionError naming `what` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"never happened within {timeout_s:g} s: {what}")
        time.sleep(poll_s)

