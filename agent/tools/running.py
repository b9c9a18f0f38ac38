"""Running a tool: every problem becomes an "Error: ..." result for the model, and each run is
bounded by the time it is given, without signals (RQ owns SIGALRM).

A Python tool runs in a thread, which Python cannot kill. One that outlives its time is abandoned:
it is asked to stop (an exception raised in it at its next bytecode, which a tool can swallow) and
its OS thread is given the lowest CPU priority, so it weighs less on the rest of the turn; a worker
that still holds one after its job is recycled (agent/hosting/worker_process.py), which is the only
sure end for arbitrary Python.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from agent import bounded_json
from agent.text.surrogates import scrub
from agent.tools.registry import REGISTRY, ToolError, check_arguments

MAX_OUTPUT_CHARS = 4000  # characters of a tool's output sent back to the model
ERROR_PREFIX = "Error: "  # starts a failed run's output, for the model and the page
TRUNCATED_MARKER = "\n... [output truncated]"
RETURN_GRACE_S = 0.2  # seconds a deadline-aware tool gets to return after its own budget ends
WAIT_SLICE_S = 0.05  # seconds between heartbeats while a tool runs
STOP_GRACE_S = 0.2  # seconds a tool gets to return its own result once a stop is requested
LOWEST_PRIORITY = 19  # the nice value an abandoned tool's thread runs at


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
    idempotency_key: str = "",
) -> ToolResult:
    """Run a registered tool within timeout_s; tool problems become an "Error: ..." result, never an exception.

    Setting `stop` (from another thread) ends the run within about STOP_GRACE_S: a tool that takes
    a `stop` parameter returns its own account, any other is abandoned. `heartbeat`, when given, is
    called in the caller's thread about every WAIT_SLICE_S while the tool runs. `offered`, when
    given, names the only tools this turn may run (those its model was offered). `idempotency_key` goes to
    a tool that takes one (the same for every attempt at one call: agent/turn/tool_runs.py)."""
    started = time.monotonic()
    found = REGISTRY.get(name) if offered is None or name in offered else None
    if found is None:
        known = ", ".join(sorted(n for n in REGISTRY if offered is None or n in offered)) or "none"
        return _failed(started, f"unknown tool {name[:80]!r}; available tools: {known}")
    try:
        kwargs = check_arguments(found, arguments_json)
    except ToolError as exc:
        return _failed(started, str(exc))
    if not timeout_s > 0:  # also catches NaN
        return _failed(started, f"no time left in this turn to run {name}")
    if stop is not None and stop.is_set():
        return _failed(started, f"stopped at your request before {name} started", stopped=True)
    if found.takes_timeout:
        kwargs["timeout_s"] = max(0.0, timeout_s - min(RETURN_GRACE_S, timeout_s / 10))
    if found.takes_stop:
        kwargs["stop"] = stop if stop is not None else threading.Event()
    if found.takes_idempotency_key:
        kwargs["idempotency_key"] = idempotency_key
    run = _ToolThread(name, found.func, kwargs, started)
    gave_up = run.wait(timeout_s, stop, heartbeat)
    if gave_up is not None:
        return _failed(started, gave_up, stopped=run.stopped)
    return run.result()


def _failed(started: float, reason: str, stopped: bool = False) -> ToolResult:
    output = truncate(f"{ERROR_PREFIX}{reason}")
    return ToolResult(ok=False, output=output, duration_s=time.monotonic() - started, stopped=stopped)


class _ToolThread:
    """One run of a tool's function in a daemon thread, waited for from the caller's thread.

    A daemon thread, not a `with ThreadPoolExecutor()`: a stuck tool must not block the turn or process exit."""

    def __init__(self, name: str, func: Callable, kwargs: dict, started: float) -> None:
        self.name, self.started = name, started
        self.outcome: dict = {}
        self.finished = threading.Event()
        self.stopped = False  # a stop request ended or cut the run
        # In the caller's context: whose turn it runs (acting_for.py) goes with it.
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._work, func, kwargs),
                                       name=f"tool-{name}", daemon=True)
        self.thread.start()

    def _work(self, func: Callable, kwargs: dict) -> None:
        try:
            self.outcome["output"] = _to_text(func(**kwargs), self.name)
        except BaseException as exc:  # handed to the caller thread, which decides what to convert
            self.outcome["error"] = exc
        finally:
            self.finished.set()

    def wait(self, timeout_s: float, stop: threading.Event | None, heartbeat: Callable[[], None] | None) -> str | None:
        """Until the tool returns (None), or why it was given up on and abandoned."""
        # Nothing is swallowed here: RQ's JobTimeoutException (an Exception) raised in this thread must propagate.
        give_up_at = self.started + min(timeout_s, threading.TIMEOUT_MAX)
        try:
            while not self.finished.wait(max(0.0, min(WAIT_SLICE_S, give_up_at - time.monotonic()))):
                if stop is not None and stop.is_set():
                    self.stopped = True
                    if self.finished.wait(STOP_GRACE_S):
                        break
                    took_s = time.monotonic() - self.started
                    _abandon(self.thread, self.finished)
                    return f"stopped at your request after {took_s:.1f} s, before {self.name} finished"
                if time.monotonic() >= give_up_at:
                    _abandon(self.thread, self.finished)
                    return (f"{self.name} did not finish within {timeout_s:.1f} s (the tool's time limit) "
                            "and was abandoned")
                if heartbeat is not None:
                    heartbeat()
        except BaseException:
            # RQ's job timeout (or a signal) raised in this thread: the tool is left behind all the same.
            _abandon(self.thread, self.finished)
            raise
        # A tool that watches `stop` returns as soon as it is set, often before this loop looks at it.
        self.stopped = self.stopped or (stop is not None and stop.is_set())
        return None

    def result(self) -> ToolResult:
        """What the finished tool returned, or the error it raised, as the model is told."""
        error = self.outcome.get("error")
        if error is not None:
            if not isinstance(error, Exception):
                raise error  # SystemExit, KeyboardInterrupt: never swallowed
            if isinstance(error, ToolError):
                return _failed(self.started, str(error), self.stopped)
            return _failed(self.started, f"{self.name} raised {type(error).__name__}: {error}", self.stopped)
        output = truncate(self.outcome["output"])
        return ToolResult(ok=True, output=output, duration_s=time.monotonic() - self.started, stopped=self.stopped)


class ToolAbandoned(BaseException):
    """Raised inside a tool's thread once its run was given up: a BaseException, so that a tool's
    `except Exception` does not swallow it."""


_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()


def _abandon(thread: threading.Thread, finished: threading.Event) -> None:
    """Remember a tool thread we gave up on, ask it to stop, and make it cheap while it does not."""
    with _abandoned_lock:
        _abandoned.append(thread)
    if finished.is_set() or thread.ident is None:
        return
    # Best effort, both: a tool that swallows the exception, or spins inside one C call, goes on.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(ToolAbandoned))
    if thread.native_id is not None:
        with contextlib.suppress(OSError):  # on Linux, PRIO_PROCESS with a thread id sets that thread alone
            os.setpriority(os.PRIO_PROCESS, thread.native_id, LOWEST_PRIORITY)


def abandoned_tools(grace_s: float = 0.0) -> list[str]:
    """Names of the tool threads this process abandoned that still run, after giving them `grace_s` to end."""
    end = time.monotonic() + grace_s
    with _abandoned_lock:
        threads = list(_abandoned)
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    with _abandoned_lock:
        _abandoned[:] = [thread for thread in _abandoned if thread.is_alive()]
        return [thread.name for thread in _abandoned]


def _to_text(result: object, name: str) -> str:
    try:  # checked first: json.dumps and str recurse, and a value nested too deeply is said so in words
        bounded_json.check(result)
    except bounded_json.TooDeep as exc:
        raise ToolError(f"{name} returned a value {exc}") from None
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
