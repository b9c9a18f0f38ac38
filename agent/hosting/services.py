"""The embedded services a process needs: Redis (shared per machine) and the worker pool
(one per process that needs workers), started once and stopped when the process exits.

Streamlit reruns the script, opens a session per browser tab, and re-imports edited modules
on a hot reload, so the process-wide record lives on the `sys` module, guarded by a lock.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from agent import tracing
from agent.conversation.store import Store
from agent.hosting import pool
from agent.runtime.connection import describe, is_disk_error, queue_client, state_client
from agent.runtime.embedded_redis import EmbeddedRedis, RedisNotAnswering, data_dir
from agent.settings import Settings, redis_maxmemory_mb

log = logging.getLogger(__name__)

POOL_START_TIMEOUT_S = 30.0  # seconds for the pool to report ready
POOL_STOP_TIMEOUT_S = 10.0  # seconds for the pool to stop its workers
POOL_CHECK_S = 1.0  # seconds between two looks at whether the pool is still there
POOL_RESTART_MIN_S = 1.0  # seconds before starting again a pool that died young; doubled each time it does
POOL_RESTART_MAX_S = 30.0  # the longest wait between two starts of a pool that keeps dying
POOL_STABLE_S = 60.0  # a pool that ran this long died of something new: it is started again at once
_RECORD = "_agent_services"


class ServiceError(RuntimeError):
    """A service could not be reached or started; the message is for a person."""


@dataclass
class Services:
    redis_url: str
    embedded: EmbeddedRedis | None = None
    pool: pool.PoolHandle | None = None
    demo_url: str | None = None
    workers: int = 0
    drain: bool = False
    owner_pid: int = field(default_factory=os.getpid)
    pool_restarts: int = 0  # times the pool was found gone and started again
    stopping: threading.Event = field(default_factory=threading.Event)
    pool_lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self, settings: Settings) -> Store:
        return Store(state_client(self.redis_url), settings.state_ttl_s,
                     max_conversation_bytes=settings.max_conversation_bytes)

    def queue_connection(self) -> redis.Redis:
        return queue_client(self.redis_url)

    def stop(self) -> None:
        if self.owner_pid != os.getpid():
            return
        self.stopping.set()  # the keeper starts no pool from now on
        with self.pool_lock:
            if self.pool is not None:
                self.pool.stop(pool.DRAIN_MAX_S + POOL_STOP_TIMEOUT_S if self.drain else POOL_STOP_TIMEOUT_S)
            self.pool = None
        if self.embedded is not None:
            self.embedded.release()
            self.embedded = None


def _record() -> dict:
    record = getattr(sys, _RECORD, None)
    if record is None:
        record = {"lock": threading.Lock(), "services": None}
        setattr(sys, _RECORD, record)
    return record


def ensure(settings: Settings, *, workers: int | None = None, drain: bool = False) -> Services:
    """Start (once per process) what this process needs, and return it.

    With `drain`, stopping waits for the turns its workers are running, which may belong to
    other clients of the same Redis (the CLI uses it; the page stops promptly instead)."""
    record = _record()
    with record["lock"]:
        services = record["services"]
        if services is not None and services.owner_pid == os.getpid():
            return services
        services = _start(settings, settings.workers if workers is None else workers, drain)
        tracing.setup()
        record["services"] = services
        atexit.register(shutdown)
        return services


def shutdown() -> None:
    """Stop what this process started (also registered with atexit)."""
    record = _record()
    with record["lock"]:
        services = record["services"]
        record["services"] = None
    if services is not None:
        services.stop()


def _start(settings: Settings, workers: int, drain: bool = False) -> Services:
    url, embedded = acquire_redis(settings)
    services = Services(redis_url=url, embedded=embedded, workers=workers, drain=drain)
    if workers > 0:
        try:
            services.pool = _start_pool(url, workers, drain)
            services.demo_url = services.pool.demo_url
        except BaseException:
            services.stop()
            raise
        threading.Thread(target=keep_pool, args=(services,), name="pool-keeper", daemon=True).start()
    return services


def keep_pool(services: Services) -> None:
    """Start the pool again whenever it is gone (killed, crashed, out of memory), until the services stop.

    Its workers die with it (PR_SET_PDEATHSIG), and with them its watch over the running turns and its
    demo model: without a new pool, the page would wait for workers that never come. The new pool's
    watch resumes the turns the dead one's workers left (turn_watch.py). A pool that keeps dying young
    is started again less and less often, up to POOL_RESTART_MAX_S apart."""
    wait_s = POOL_RESTART_MIN_S
    started = time.monotonic()
    while not services.stopping.wait(POOL_CHECK_S):
        handle = services.pool
        if handle is None or handle.proc.poll() is None:
            continue
        lived_s = time.monotonic() - started
        wait_s = POOL_RESTART_MIN_S if lived_s >= POOL_STABLE_S else wait_s
        log.warning("the worker pool (pid %s) is gone (exit status %s) after %.0f s; starting it again in %g s",
                    handle.proc.pid, handle.proc.returncode, lived_s, wait_s)
        if services.stopping.wait(wait_s):
            return
        with services.pool_lock:
            if services.stopping.is_set() or services.pool is not handle:
                continue
            started = time.monotonic()
            try:
                services.pool = _start_pool(services.redis_url, services.workers, services.drain)
            except ServiceError as exc:
                log.error("the worker pool did not start again: %s", exc)
            else:
                services.demo_url = services.pool.demo_url
                services.pool_restarts += 1
                log.info("the worker pool is running again (pid %s)", services.pool.proc.pid)
        wait_s = min(POOL_RESTART_MAX_S, wait_s * 2)


def acquire_redis(settings: Settings) -> tuple[str, EmbeddedRedis | None]:
    """REDIS_URL, or the embedded server the app uses (joined, or started; waited for, saying so on
    stderr, when it runs but does not answer: never replaced), once it answers. An embedded server is
    the caller's to release. ServiceError, in one sentence, when there is no Redis to be had."""
    if settings.redis_url:
        check_redis(settings.redis_url)
        return settings.redis_url, None
    embedded = EmbeddedRedis(maxmemory_mb=redis_maxmemory_mb())
    try:
        url = embedded.acquire(wait_s=settings.redis_wait_s)
    except RedisNotAnswering as exc:
        raise ServiceError(str(exc)) from exc
    except (OSError, RuntimeError) as exc:
        raise ServiceError(f"could not start the embedded Redis: {exc}") from exc
    try:
        check_redis(url)
    except BaseException:
        embedded.release()
        raise
    return url, embedded


@contextlib.contextmanager
def redis_for_command(settings: Settings) -> Iterator[str]:
    """`acquire_redis` for a command's lifetime (worker.py, dashboard.py): released when it ends."""
    url, embedded = acquire_redis(settings)
    try:
        yield url
    finally:
        if embedded is not None:
            embedded.release()


def check_redis(url: str) -> None:
    client = state_client(url)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise ServiceError(f"Redis at {describe(url)} refused the password: {exc}") from exc
    except redis.ResponseError as exc:
        if not is_disk_error(exc):
            raise ServiceError(f"Redis at {describe(url)} answered with an error: {exc}") from exc
        # It answers, but refuses PING with the writes while it cannot save (MISCONF): not an
        # unreachable server. A write says so in words when it is refused.
    except redis.RedisError as exc:
        raise ServiceError(f"Redis at {describe(url)} is unreachable: {exc}") from exc
    finally:
        client.close()


def _start_pool(url: str, workers: int, drain: bool) -> pool.PoolHandle:
    log_path = Path(data_dir()) / "logs" / f"pool-{os.getpid()}.log"
    try:
        return pool.launch(url, workers, log_path=log_path, drain=drain, start_timeout_s=POOL_START_TIMEOUT_S)
    except RuntimeError as exc:
        raise ServiceError(str(exc)) from exc
