"""A fleet on one machine, for the tests, the chaos run and the bench: one real Redis on TCP (harness/tcp_redis.py),
several pools (`python worker.py`, each with its own AGENT_DATA_DIR and workers) standing in for machines,
and page servers (`make run`'s launcher, bound to 127.0.0.1) with no workers of their own, all on that Redis.

Everything started here is stopped by pid or process group in `close()` (the context manager's exit, also on
failure): each pool's processes carry a marker in their environment, so a worker or work horse that outlived
its supervisor is found and killed too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

from agent.conversation.store import Store
from agent.queue import get_queue
from agent.runtime.connection import queue_client, state_client
from harness.page import PageServer
from harness.processes import kill, processes_with_env
from harness.tcp_redis import TcpRedis

ROOT = Path(__file__).resolve().parent.parent  # where worker.py is
READY_TIMEOUT_S = 90.0  # seconds for a pool to say it is ready and its workers to register (a busy 2-core machine)
STOP_TIMEOUT_S = 20.0  # seconds for worker.py to stop its workers on SIGTERM before SIGKILL
MARKER = "AGENT_FLEET_MARKER"  # in the environment of every process of a pool: found by it, also when orphaned
WORKER_COMMAND = "agent.hosting.worker_process"
STATE_TTL_S = 6 * 3600  # seconds; every conversation outlives any run, for the checks after it


@dataclass
class FleetPool:
    """One `python worker.py` (a machine's supervisor) and its workers."""

    index: int
    dir: Path
    url: str
    workers: int
    worker_class: str
    env: dict[str, str]
    marker: str
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.dir / "worker.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, queue_connection: redis.Redis | None = None) -> FleetPool:
        """Start worker.py; wait for its ready line and, with `queue_connection`, for its workers to register."""
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "REDIS_URL"))}
        env.update(REDIS_URL=self.url, AGENT_DATA_DIR=str(self.dir), AGENT_MCP_CONFIG="off", PYTHONUNBUFFERED="1",
                   AGENT_STATE_TTL=str(STATE_TTL_S), **self.env)
        env[MARKER] = self.marker
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "worker.py", "--workers", str(self.workers), "--class", self.worker_class],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
        self.starts += 1
        try:
            line = _first_line(self.proc, READY_TIMEOUT_S)
            if not line.startswith("ready"):
                raise RuntimeError(f"pool {self.index} did not start: {self.log_tail()}")
            if queue_connection is not None:
                self.wait_registered(queue_connection)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_registered(self, connection: redis.Redis, timeout_s: float = READY_TIMEOUT_S) -> None:
        prefix = f"rq:worker:agent-{self.proc.pid}-".encode()  # the names the pool gives its workers
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.proc.poll() is None:
            with contextlib.suppress(redis.RedisError):
                if sum(key.startswith(prefix) for key in connection.smembers("rq:workers")) >= self.workers:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"pool {self.index}: {self.workers} workers did not register: {self.log_tail()}")

    def worker_processes(self) -> list[tuple[int, str]]:
        """(pid, RQ name) of each live worker of this pool's supervisor."""
        found = []
        for child in _children(self.pid):
            with contextlib.suppress(psutil.Error):
                command = child.cmdline()
                if any(WORKER_COMMAND in part for part in command) and "--name" in command:
                    found.append((child.pid, command[command.index("--name") + 1]))
        return found

    def members(self) -> list[int]:
        """Every live process of this pool (the supervisor, workers, work horses), orphans included."""
        return processes_with_env(MARKER, self.marker)

    def kill(self) -> list[int]:
        """A machine lost: SIGKILL the supervisor and every process of its pool at once; returns their pids."""
        pids = self.members()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)  # frozen first: none of them acts on another's death
        kill(pids)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        return pids

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to worker.py (it stops its workers, warm then cold), SIGKILL if it lingers; then every
        process of the pool that is left."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        kill(self.members())

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


@dataclass
class Fleet:
    """Redis on TCP, `pools` pools of `workers` workers (classes in turn from `classes`), `pages` page servers."""

    dir: Path
    pools: int = 3
    workers: int = 4
    classes: tuple[str, ...] = ("simple",)
    pages: int = 2
    pool_env: dict[str, str] = field(default_factory=dict)
    state_ttl_s: int = STATE_TTL_S
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)

    def __post_init__(self) -> None:
        self.redis = TcpRedis(self.dir / "redis", say=self.say)
        self.marker = f"fleet-{os.getpid()}-{time.time_ns()}"
        self.members: list[FleetPool] = []
        self.page_servers: list[PageServer] = []
        self.client = self.store = self.queue_connection = self.queue = None

    @property
    def url(self) -> str:
        return self.redis.url

    def start(self) -> Fleet:
        try:
            self.redis.start()
            self.client = state_client(self.url)
            self.store = Store(self.client, ttl_s=self.state_ttl_s)
            self.queue_connection = queue_client(self.url)
            self.queue = get_queue(self.queue_connection)
            self.members = [FleetPool(i, self.dir / f"pool-{i}", self.url, self.workers,
                                      self.classes[i % len(self.classes)], dict(self.pool_env),
                                      f"{self.marker}-pool-{i}") for i in range(self.pools)]
            for pool in self.members:
                pool.start(self.queue_connection)
            for i in range(self.pages):
                page_dir = self.dir / f"page-{i}"
                page_dir.mkdir(parents=True, exist_ok=True)
                self.page_servers.append(PageServer(page_dir, self.dir / f"page-{i}.log",
                                                    env={"REDIS_URL": self.url, "AGENT_WORKERS": "0"}))
        except BaseException:
            self.close()
            raise
        return self

    def restart_pool(self, pool: FleetPool) -> None:
        pool.start(self.queue_connection)

    def close(self) -> None:
        """Stop the page servers, the pools and Redis, each whatever became of the others."""
        for server in self.page_servers:
            with contextlib.suppress(Exception):
                server.note_redis()
                server.stop()
                server.kill_leftovers()
        for pool in self.members:
            with contextlib.suppress(Exception):
                pool.stop()
        for pool in self.members:
            kill(pool.members())
        for client in (self.client, self.queue_connection):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        self.redis.stop()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _children(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The process's first line on stdout, or "" if it says nothing in time; the pipe is closed after it."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline().decode()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if result:
        proc.stdout.close()
    return result[0] if result else ""
