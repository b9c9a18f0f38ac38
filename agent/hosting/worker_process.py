"""One RQ worker process: `python -m agent.hosting.worker_process`. The pool and worker.py start these."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import redis
from rq.serializers import JSONSerializer

import agent.turn  # noqa: F401 - preloaded: a forked work horse inherits it instead of importing it per job
from agent import tracing
from agent.conversation import workers as live_workers
from agent.hosting.pool import RECYCLE_EXIT_CODE
from agent.hosting.worker_classes import DEFAULT_WORKER_CLASS, IN_PROCESS_CLASSES, WORKER_CLASSES
from agent.queue import QUEUE_NAME, SafeJob
from agent.runtime import logs
from agent.runtime.connection import queue_client, redis_problem, state_client
from agent.runtime.with_parent import die_with_parent
from agent.tools import catalogue
from agent.tools import sources as tool_sources

log = logging.getLogger(__name__)

def make_worker(url: str, kind: str = DEFAULT_WORKER_CLASS, name: str | None = None):
    cls = WORKER_CLASSES[kind]
    return cls(
        [QUEUE_NAME],
        name=name,
        connection=queue_client(url),
        serializer=JSONSerializer,
        job_class=SafeJob,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.hosting.worker_process", description="Run one RQ worker.")
    parser.add_argument("--name")
    parser.add_argument("--class", dest="kind", choices=sorted(WORKER_CLASSES), default=DEFAULT_WORKER_CLASS)
    parser.add_argument("--burst", action="store_true", help="stop when the queue is empty")
    parser.add_argument("--with-parent", action="store_true", help="die when the parent process dies")
    args = parser.parse_args(argv)
    if args.with_parent:
        die_with_parent()
    url = os.environ.get("REDIS_URL")
    if not url:
        print("REDIS_URL: is required for a worker", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format=logs.FORMAT)
    tracing.setup()
    worker = make_worker(url, args.kind, args.name)
    beats = Beats(url, worker)
    worker.bootstrap = tools_after(worker, url, jobs_in_process=args.kind in IN_PROCESS_CLASSES, beats=beats)
    try:
        worker.work(burst=args.burst, with_scheduler=False, logging_level="WARNING")
    finally:
        beats.stop()
        close_tools()
    if getattr(worker, "recycling", False):  # only the classes with RecyclesAfterAbandonedTools recycle
        # Not through the interpreter's shutdown, which would run beside the spinning thread.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(RECYCLE_EXIT_CODE)
    return 0


def close_tools() -> None:
    """Stop the MCP servers (at most CLOSE_WAIT_S); a second stop signal meanwhile would cut that short
    and lose their last log lines, so it waits (whoever sent it still has SIGKILL, and each server's
    guard ends its group even then)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    tool_sources.close()


class Beats:
    """The worker's mark that it is there (agent/conversation/workers.py), renewed from a side thread
    from its registration to its end: the page counts these marks, not RQ's registrations, which
    outlive a killed worker by minutes."""

    def __init__(self, url: str, worker):
        self.client = state_client(url)
        self.worker = worker
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                live_workers.beat(self.client, self.worker.name, state_name(self.worker.get_state()))
            except redis.RedisError as exc:  # Redis away or full: not counted meanwhile; the next beat retries
                log.debug("worker mark not renewed: %s", redis_problem(exc))
            if self.stopping.wait(live_workers.WORKER_BEAT_S):
                return

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(live_workers.WORKER_BEAT_S + 3)
            try:
                live_workers.gone(self.client, self.worker.name)
            except redis.RedisError as exc:
                log.debug("worker mark not removed (it lapses by itself): %s", redis_problem(exc))


def state_name(state) -> str:
    """RQ's worker state as its plain value ('idle', 'busy', ...): RQ holds a str Enum or a str."""
    return str(getattr(state, "value", state))


def tools_after(worker, url: str, *, jobs_in_process: bool, beats: Beats | None = None):
    """RQ's bootstrap (which registers the worker), then the tool sources: a client sees a worker
    at once, busy starting its MCP servers, instead of none for the seconds they take.

    RQ installs its own signal handlers only after bootstrap, and tears down (deregisters) only
    after them: a SIGTERM or Ctrl-C while the servers start ends the process here instead, so it
    deregisters the worker itself rather than leave a registration behind for minutes."""
    bootstrap = worker.bootstrap

    def bootstrap_then_start_tools(*args, **kwargs) -> None:
        bootstrap(*args, **kwargs)
        if beats is not None:
            beats.start()
        previous = signal.signal(signal.SIGTERM, stop_starting)
        try:
            start_tools(url, jobs_in_process)
        except BaseException:
            worker.register_death()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    return bootstrap_then_start_tools


def stop_starting(signum, frame) -> None:
    """SIGTERM before RQ's own handler is in place: end the start-up (the caller deregisters)."""
    log.warning("stopping: signal %d while the tool sources started", signum)
    raise SystemExit(128 + signum)


def start_tools(url: str, jobs_in_process: bool) -> None:
    """Start this worker's tool sources (MCP servers once per process, not per turn) and publish the
    catalogue the page lists; a Redis hiccup here only delays the page's list, never the worker."""
    sources = tool_sources.load(jobs_in_process=jobs_in_process)
    try:
        catalogue.publish(state_client(url), sources)
    except redis.RedisError as exc:
        log.warning("the tool catalogue was not published: %s", redis_problem(exc))


if __name__ == "__main__":
    sys.exit(main())
