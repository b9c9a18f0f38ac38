"""Following a conversation from outside, as the page and the CLI do: read the version, read the
state when it moved. Every tool that waits for a turn builds on `states`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from agent.conversation.store import Store

POLL_S = 0.05  # seconds between reads of the version when a caller waits for an ending
PAGE_INTERVAL_S = 1.0  # seconds; the page's default poll interval (AGENT_POLL_INTERVAL_MS), for measurements


def states(
    store: Store,
    conversation_id: str,
    *,
    timeout_s: float,
    interval_s: float = POLL_S,
    phase_s: float = 0.0,
    event_driven: bool = False,
    tolerate: tuple[type[BaseException], ...] = (),
) -> Iterator[dict | None]:
    """Each poll's news for `timeout_s`: the state when its version moved, None when it did not.

    Plain: read the version every `interval_s` (starting `phase_s` in). Event-driven: each wait is
    `Store.wait_version`, which wakes on a write. Errors in `tolerate` (a Redis outage, say) count
    as a poll that saw nothing."""
    seen = None
    start = time.monotonic()
    next_tick = start + phase_s
    while time.monotonic() - start < timeout_s:
        state = None
        try:
            if event_driven:
                version = store.wait_version(conversation_id, seen, int(interval_s * 1000))
            else:
                time.sleep(max(0.0, next_tick - time.monotonic()))
                next_tick += interval_s
                version = store.version(conversation_id)
            if version is not None and version != seen:
                state = store.read(conversation_id)
        except tolerate:
            state = None
        if state is not None:
            seen = state["version"]
        yield state


@dataclass
class Observation:
    at: float  # epoch seconds when the client saw this version
    version: int
    tool_steps: int
    done: bool
    status: str


def follow(store: Store, conversation_id: str, *, timeout_s: float = 60.0, interval_s: float = PAGE_INTERVAL_S,
           **polling) -> list[Observation]:
    """Follow a conversation until done, as a front end would, and record what it saw when;
    TimeoutError if it never ends."""
    observations: list[Observation] = []
    for state in states(store, conversation_id, timeout_s=timeout_s, interval_s=interval_s, **polling):
        if state is None:
            continue
        tools = sum(1 for s in state["steps"] if s["kind"] == "tool" and s["turn_id"] == state["turn_id"])
        observations.append(Observation(time.time(), state["version"], tools, state["done"], state["status"]))
        if state["done"]:
            return observations
    raise TimeoutError(f"conversation {conversation_id} not done after {timeout_s} s")


class Follower(threading.Thread):
    """`follow` in a thread; `wait()` returns its observations (or raises its error)."""

    def __init__(self, store: Store, conversation_id: str, **kwargs):
        super().__init__(daemon=True)
        self.args_ = (store, conversation_id)
        self.kwargs_ = kwargs
        self.result: list[Observation] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = follow(*self.args_, **self.kwargs_)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc

    def wait(self) -> list[Observation]:
        self.join()
        if self.error is not None:
            raise self.error
        return self.result


def wait_all_done(client: redis.Redis, conversation_ids: list[str], timeout_s: float, tick_s: float = 0.1) -> None:
    """Wait until every conversation's meta says done: one pipelined read per tick, for many turns."""
    pending = list(conversation_ids)
    end = time.monotonic() + timeout_s
    while pending:
        if time.monotonic() > end:
            raise TimeoutError(f"{len(pending)} of {len(conversation_ids)} turns not done after {timeout_s:g} s")
        with client.pipeline(transaction=False) as pipe:
            for cid in pending:
                pipe.hget(f"agent:conv:{cid}:meta", "done")
            flags = pipe.execute()
        pending = [cid for cid, flag in zip(pending, flags, strict=True) if flag != b"1"]
        if pending:
            time.sleep(tick_s)
