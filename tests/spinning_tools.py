"""A tool that outlives its timeout, offered through AGENT_TOOLS=tests.spinning_tools
(tests/test_abandoned_tools.py). It appends "<pid> <shape>" to the file SPIN_PID_FILE names, so a
test knows which worker process holds it."""

from __future__ import annotations

import os
import time
from typing import Literal

Shape = Literal["plain", "stubborn", "sleepy", "swallow_once"]


def spin(shape: Shape = "stubborn") -> str:
    """Spin for ever, in one of several ways.

    Args:
        shape: plain (a bare loop), stubborn (swallows every exception), sleepy (swallows them and
            naps between turns), swallow_once (swallows the first exception, then loops bare)
    """
    path = os.environ.get("SPIN_PID_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {shape}\n")
    if shape == "plain":
        while True:
            pass
    if shape == "swallow_once":
        try:
            while True:
                pass
        except BaseException:  # noqa: BLE001 - the point: a tool that refuses to stop
            pass
        while True:
            pass
    while True:
        try:
            while True:
                if shape == "sleepy":
                    time.sleep(0.001)
        except BaseException:  # noqa: BLE001, S112 - the point: a tool that refuses to stop
            continue


TOOLS = [spin]
