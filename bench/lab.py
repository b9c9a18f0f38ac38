"""The bench's lab: a private Redis and worker pools (from `harness`), the messages every figure
uses, and the product's own path for submitting a turn.

Everything started here is stopped by `Lab.close()`, which `python -m bench` runs in a finally
block (also on Ctrl-C or SIGTERM). Pools also get `--parent-pid`, so they stop by themselves if
this process is killed outright.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.hosting.pool import PoolHandle
from agent.queue import submit_turn
from agent.settings import TurnConfig
from harness.pools import start_pool, stop_pool, worker_pids
from harness.private_redis import PrivateRedis
from harness.processes import children, rss_kib

STATE_TTL_S = 3600  # seconds; longer than any benchmark, so nothing expires mid-run

# Three tools, one per model round-trip: calculator, current_time, search_docs, then the answer.
THREE_TOOL_MESSAGE = "What is 17*23, what time is it in Tokyo, and how does the deadline work?"
ONE_CALL_MESSAGE = "hello"  # the demo model answers without tools: one model call


@dataclass
class PoolProcess:
    """A pool of `workers` workers of one class (and its demo provider), as the figures need it."""

    handle: PoolHandle
    workers: int
    worker_class: str

    @property
    def demo_url(self) -> str | None:
        return self.handle.demo_url

    def worker_pids(self) -> list[int]:
        return worker_pids(self.handle)

    def rss_per_worker_kib(self) -> list[int]:
        """Each worker's RSS plus that of its work horse, if one is running."""
        return [rss_kib(pid) + sum(rss_kib(c) for c in children(pid)) for pid in self.worker_pids()]

    def mean_rss_mib(self) -> float | None:
        per_worker = self.rss_per_worker_kib()
        return round(statistics.mean(per_worker) / 1024, 1) if per_worker else None


@dataclass
class Lab:
    """A private embedded Redis and the pools started against it."""

    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agent-bench-")))
    redis: PrivateRedis | None = None
    pools: list[PoolProcess] = field(default_factory=list)

    def start(self) -> Lab:
        self.redis = PrivateRedis(self.dir / "redis", state_ttl_s=STATE_TTL_S)
        self.url, self.client, self.store = self.redis.url, self.redis.client, self.redis.store
        self.queue_connection, self.queue = self.redis.queue_connection, self.redis.queue
        return self

    def pool(self, workers: int, worker_class: str) -> PoolProcess:
        """Start a pool and wait until all its workers have registered with RQ."""
        handle = start_pool(self.url, workers, self.dir / f"pool-{len(self.pools)}.log", worker_class=worker_class,
                            env={"AGENT_STATE_TTL": str(STATE_TTL_S)}, queue_connection=self.queue_connection)
        pool = PoolProcess(handle, workers, worker_class)
        self.pools.append(pool)
        return pool

    def stop_pool(self, pool: PoolProcess) -> None:
        stop_pool(pool.handle, self.url)
        with contextlib.suppress(ValueError):
            self.pools.remove(pool)
        # A clean slate for the next pool: no queued jobs, no registrations, no conversations.
        self.client.flushdb()

    def close(self) -> None:
        for pool in list(self.pools):
            with contextlib.suppress(Exception):
                stop_pool(pool.handle, self.url)
        self.pools.clear()
        if self.redis is not None:
            self.redis.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def submit(lab: Lab, conversation_id: str, message: str, config: TurnConfig) -> tuple[str, float]:
    """Enqueue a turn through the product's own path; returns (turn id, submit time)."""
    submitted_at = time.time()
    turn_id = submit_turn(lab.store, lab.queue, conversation_id, message, config)
    return turn_id, submitted_at


class NoQueue:
    """A stand-in queue for the in-process baseline: submit_turn's state writes, no enqueue."""

    def enqueue(self, *args, **kwargs):
        return None

