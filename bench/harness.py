"""What every measurement needs: a private Redis, worker pools as subprocesses, clients that
follow a conversation the way a front end does, and small statistics helpers.

Everything started here is stopped by `Lab.close()`, which `python -m bench` runs in a
finally block (also on Ctrl-C or SIGTERM). Pools also get `--parent-pid`, so they stop by
themselves if this process is killed outright.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from agent.queue import get_queue, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.runtime.pool import launch
from agent.settings import TurnConfig
from agent.store import Store

ROOT = Path(__file__).resolve().parent.parent
POOL_READY_TIMEOUT_S = 60.0  # seconds for a pool to print "ready" and its workers to register
POOL_STOP_TIMEOUT_S = 15.0  # seconds for a pool to stop its workers before SIGKILL
STATE_TTL_S = 3600  # seconds; longer than any benchmark, so nothing expires mid-run

# Three tools, one per model round-trip: calculator, current_time, search_docs, then the answer.
THREE_TOOL_MESSAGE = "What is 17*23, what time is it in Tokyo, and how does the deadline work?"
ONE_CALL_MESSAGE = "hello"  # the demo model answers without tools: one model call


# -- statistics ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float], scale: float = 1.0, digits: int = 1) -> dict:
    """n, p50, p95, min, max of values times `scale`, rounded."""
    scaled = [v * scale for v in values]

    def r(x):
        return None if x is None else round(x, digits)

    return {
        "n": len(scaled),
        "p50": r(percentile(scaled, 50)),
        "p95": r(percentile(scaled, 95)),
        "min": r(min(scaled)) if scaled else None,
        "max": r(max(scaled)) if scaled else None,
    }


# -- processes -----------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """Direct children of a process, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class PoolProcess:
    """`python -m agent.runtime.pool` as a subprocess: N workers of one class and the demo provider."""

    def __init__(self, url: str, workers: int, worker_class: str, log_path: Path):
        self.workers = workers
        self.worker_class = worker_class
        self.log_path = log_path
        self.handle = launch(url, workers, log_path=log_path, worker_class=worker_class,
                             env={"AGENT_STATE_TTL": str(STATE_TTL_S)}, start_timeout_s=POOL_READY_TIMEOUT_S)
        self.proc = self.handle.proc
        self.demo_url = self.handle.demo_url

    def worker_pids(self) -> list[int]:
        return children(self.proc.pid)

    def rss_per_worker_kib(self) -> list[int]:
        """Each worker's RSS plus that of its work horse, if one is running."""
        return [rss_kib(pid) + sum(rss_kib(c) for c in children(pid)) for pid in self.worker_pids()]

    def log_tail(self, chars: int = 3000) -> str:
        return self.handle.log_tail(chars)

    def stop(self) -> None:
        # Fork workers' horses run in their own process groups: kill those the pool leaves behind.
        horses = [c for pid in self.worker_pids() for c in children(pid)]
        self.handle.stop(POOL_STOP_TIMEOUT_S)
        for pid in horses:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Lab:
    """A private embedded Redis and the pools started against it."""

    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agent-bench-")))
    server: EmbeddedRedis | None = None
    url: str = ""
    pools: list[PoolProcess] = field(default_factory=list)

    def start(self) -> Lab:
        self.server = EmbeddedRedis(self.dir / "redis")
        self.url = self.server.acquire()
        self.client = state_client(self.url)
        self.store = Store(self.client, STATE_TTL_S)
        self.queue_connection = queue_client(self.url)
        self.queue = get_queue(self.queue_connection)
        return self

    def pool(self, workers: int, worker_class: str) -> PoolProcess:
        """Start a pool and wait until all its workers have registered with RQ."""
        pool = PoolProcess(self.url, workers, worker_class, self.dir / f"pool-{len(self.pools)}.log")
        self.pools.append(pool)
        prefix = f"rq:worker:agent-{pool.proc.pid}-".encode()
        end = time.monotonic() + POOL_READY_TIMEOUT_S
        while time.monotonic() < end:
            registered = [k for k in self.queue_connection.smembers("rq:workers") if k.startswith(prefix)]
            if len(registered) >= workers:
                return pool
            if pool.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{workers} {worker_class} workers did not register: {pool.log_tail()}")

    def stop_pool(self, pool: PoolProcess) -> None:
        pool.stop()
        with contextlib.suppress(ValueError):
            self.pools.remove(pool)
        # A clean slate for the next pool: no queued jobs, no registrations, no conversations.
        self.client.flushdb()

    def close(self) -> None:
        for pool in list(self.pools):
            with contextlib.suppress(Exception):
                pool.stop()
        self.pools.clear()
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.client.close()
                self.queue_connection.close()
            self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- turns and the clients that follow them -----------------------------------------------


def submit(lab: Lab, conversation_id: str, message: str, config: TurnConfig) -> tuple[str, float]:
    """Enqueue a turn through the product's own path; returns (turn id, submit time)."""
    submitted_at = time.time()
    turn_id = submit_turn(lab.store, lab.queue, conversation_id, message, config)
    return turn_id, submitted_at


class NoQueue:
    """A stand-in queue for the in-process baseline: submit_turn's state writes, no enqueue."""

    def enqueue(self, *args, **kwargs):
        return None


@dataclass
class Observation:
    at: float  # epoch seconds when the client saw this version
    version: int
    tool_steps: int
    done: bool
    status: str


def follow(
    store: Store,
    conversation_id: str,
    *,
    event_driven: bool,
    interval_s: float = 1.0,
    phase_s: float = 0.0,
    timeout_s: float = 60.0,
) -> list[Observation]:
    """Follow a conversation until done, as a front end would, and record what it saw when.

    Plain: read the version every `interval_s` (starting `phase_s` in), the whole state when it
    moved. Event-driven: the same, but each wait is `Store.wait_version`, which wakes on a write.
    """
    seen = None
    observations: list[Observation] = []
    start = time.time()
    next_tick = start + phase_s
    while time.time() - start < timeout_s:
        if event_driven:
            version = store.wait_version(conversation_id, seen, int(interval_s * 1000))
        else:
            delay = next_tick - time.time()
            if delay > 0:
                time.sleep(delay)
            next_tick += interval_s
            version = store.version(conversation_id)
        if version is None or version == seen:
            continue
        state = store.read(conversation_id)
        at = time.time()
        seen = state["version"]
        tools = sum(1 for s in state["steps"] if s["kind"] == "tool" and s["turn_id"] == state["turn_id"])
        observations.append(Observation(at, seen, tools, state["done"], state["status"]))
        if state["done"]:
            return observations
    raise TimeoutError(f"conversation {conversation_id} not done after {timeout_s} s")


class Follower(threading.Thread):
    """`follow` in a thread; `.result` holds the observations (or `.error`)."""

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
