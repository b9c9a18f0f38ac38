"""Worker pools (`python -m agent.hosting.pool`) started against a Redis, and stopped with nothing
left behind: a forking worker's work horse runs in its own process group, so the pool's own stop
can miss it."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from agent.hosting.pool import PoolHandle, launch
from harness.processes import children, kill, processes_with_env

READY_TIMEOUT_S = 60.0  # seconds for a pool to say it is ready and its workers to register
STOP_TIMEOUT_S = 15.0  # seconds for a pool to stop its workers before SIGKILL
WORKER_COMMAND = "agent.hosting.worker_process"  # in the command line of every worker and work horse
REGISTRATION_POLL_S = 0.05  # seconds between looks at RQ's worker registry


def start_pool(url: str, workers: int, log_path: Path, *, worker_class: str = "simple", env: dict | None = None,
               demo: bool = True, queue_connection: redis.Redis | None = None) -> PoolHandle:
    """Start a pool; with `queue_connection`, also wait until every one of its workers has registered.

    Its workers start no MCP servers unless `env` names a config: what the tools measure and test is
    the turn's machinery, and a tool server per worker restart would only add noise."""
    env = {"AGENT_MCP_CONFIG": "off", **(env or {})}
    handle = launch(url, workers, log_path=log_path, worker_class=worker_class, env=env, demo=demo,
                    start_timeout_s=READY_TIMEOUT_S)
    if queue_connection is not None:
        try:
            wait_for_workers(handle, queue_connection, workers)
        except BaseException:
            stop_pool(handle, url)
            raise
    return handle


def wait_for_workers(handle: PoolHandle, connection: redis.Redis, count: int,
                     timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until `count` workers of this pool have registered with RQ; RuntimeError if they do not."""
    prefix = f"rq:worker:agent-{handle.proc.pid}-".encode()  # the names the pool gives its workers
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and handle.proc.poll() is None:
        if sum(key.startswith(prefix) for key in connection.smembers("rq:workers")) >= count:
            return
        time.sleep(REGISTRATION_POLL_S)
    raise RuntimeError(f"{count} workers did not register: {handle.log_tail()}")


def worker_pids(handle: PoolHandle) -> list[int]:
    """The pool's workers (its direct children)."""
    return children(handle.proc.pid)


def stop_pool(handle: PoolHandle, url: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the pool, then kill every worker or work horse on its Redis that outlived it (orphaned
    horses included, which no process tree leads to any more)."""
    handle.stop(timeout_s)
    kill(processes_with_env("REDIS_URL", url, command_part=WORKER_COMMAND))
