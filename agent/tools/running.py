"""Running a tool: every problem becomes an "Error: ..." result for the model, and each run is
bounded by the time it is given, without signals (RQ owns SIGALRM)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from agent.surrogates import scrub
from agent.tools.registry import REGISTRY, ToolError, check_arguments

MAX_OUTPUT_CHARS = 4000  # characters of a tool's output sent back to the model
ERROR_PREFIX = "Error: "  # starts a failed run's output, for the model and the page
TRUNCATED_MARKER = "\n... [output truncated]"
RETURN_GRACE_S = 0.2  # seconds a deadline-aware tool gets to return after its own budget ends
WAIT_SLICE_S = 0.05  # seconds between heartbeats while a tool runs
STOP_GRACE_S = 0.2  # seconds a tool gets to return its own result once a stop is requested


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    output: str  # the tool message content; starts with "Error: " when ok is False
    duration_s: float
    stopped: bool = False  # a stop request ended the run (the output says how far it got)


def run_tool(
    name: str,
    arguments_json: str,
    timeout_s: float,
    *,
    stop: threading.Event | None = None,
    heartbeat: Callable[[], None] | None = None,
    offered: Collection[str] | None = None,
) -> ToolResult:
    """Run a registered tool within timeout_s; tool problems become an "Error: ..." result, never an exception.

    Setting `stop` (from another thread) ends the run within about STOP_GRACE_S: a tool that takes
    a `stop` parameter returns its own account, any other is abandoned. `heartbeat`, when given, is
    called in the caller's thread about every WAIT_SLICE_S while the tool runs. `offered`, when
    given, names the only tools this turn may run (those its model was offered)."""
    started = time.monotonic()

    def failed(reason: str, stopped: bool = False) -> ToolResult:
        output = truncate(f"{ERROR_PREFIX}{reason}")
        return ToolResult(ok=False, output=output, duration_s=time.monotonic() - started, stopped=stopped)

    found = REGISTRY.get(name) if offered is None or name in offered else None
    if found is None:
        known = ", ".join(sorted(n for n in REGISTRY if offered is None or n in offered)) or "none"
        return failed(f"unknown tool {name[:80]!r}; available tools: {known}")
    try:
        kwargs = check_arguments(found, arguments_json)
    except ToolError as exc:
        return failed(str(exc))
    if not timeout_s > 0:  # also catches NaN
        return failed(f"no time left in this turn to run {name}")
    if stop is not None and stop.is_set():
        return failed(f"stopped at your request before {name} started", stopped=True)
    if found.takes_timeout:
        kwargs["timeout_s"] = max(0.0, timeout_s - min(RETURN_GRACE_S, timeout_s / 10))
    if found.takes_stop:
        kwargs["stop"] = stop if stop is not None else threading.Event()

    outcome: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["output"] = _to_text(found.func(**kwargs))
        except BaseException as exc:  # handed to the caller thread, which decides what to convert
            outcome["error"] = exc
        finally:
            finished.set()

    # A daemon thread, not a `with ThreadPoolExecutor()`: a stuck tool must not block the turn or process exit.
    threading.Thread(target=work, name=f"tool-{name}", daemon=True).start()
    # No broad except here: RQ's JobTimeoutException (an Exception) raised in this thread must propagate.
    give_up_at = started + min(timeout_s, threading.TIMEOUT_MAX)
    stopped = False
    while not finished.wait(max(0.0, min(WAIT_SLICE_S, give_up_at - time.monotonic()))):
        if stop is not None and stop.is_set():
            stopped = True
            if finished.wait(STOP_GRACE_S):
                break
            took_s = time.monotonic() - started
            return failed(f"stopped at your request after {took_s:.1f} s, before {name} finished", stopped=True)
        if time.monotonic() >= give_up_at:
            return failed(f"{name} did not finish within {timeout_s:.1f} s (the tool's time limit) and was abandoned")
        if heartbeat is not None:
            heartbeat()
    # A tool that watches `stop` returns as soon as it is set, often before this loop looks at it.
    stopped = stopped or (stop is not None and stop.is_set())
    error = outcome.get("error")
    if error is not None:
        if not isinstance(error, Exception):
            raise error  # SystemExit, KeyboardInterrupt: never swallowed
        if isinstance(error, ToolError):
            return failed(str(error), stopped)
        return failed(f"{name} raised {type(error).__name__}: {error}", stopped)
    output = truncate(outcome["output"])
    return ToolResult(ok=True, output=output, duration_s=time.monotonic() - started, stopped=stopped)


def _to_text(result: object) -> str:
    if isinstance(result, dict | list):
        return json.dumps(result, ensure_ascii=False, default=str)
    return "" if result is None else str(result)


def truncate(text: str) -> str:
    """A tool's output as it goes to the model: valid UTF-8 and at most MAX_OUTPUT_CHARS."""
    # A tool's output goes to Redis and back to the provider as UTF-8: no lone surrogates.
    text = scrub(text)
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[: MAX_OUTPUT_CHARS - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER
