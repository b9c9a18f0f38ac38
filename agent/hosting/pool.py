"""The worker pool: a small supervisor process that runs N workers and the demo provider.

`python -m agent.hosting.pool --workers N [--parent-pid P] [--log-file PATH]`. The app or CLI starts
it as its own process (never a fork of the Streamlit process, which has threads). It restarts a
worker that dies (a killed job takes its worker with it), stops every worker by its process group
on SIGTERM/SIGINT, and stops by itself when the process that started it is gone. With --log-file,
it writes its log and its workers' output there, rotated by size (agent/runtime/logs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent import PROJECT_ROOT
from agent.runtime.logs import FORMAT, LOG_BACKUPS, LOG_MAX_BYTES, log_to_rotating_file, relay
from agent.runtime.stop_signals import record_stop_signals

log = logging.getLogger("agent.hosting.pool")

WATCH_INTERVAL_S = 0.2  # seconds between checks of the parent and the workers
WARM_STOP_S = 1.5  # seconds a worker gets to finish on its own before a cold stop (RQ ignores a 2nd signal < 1 s)
DRAIN_MAX_S = 300.0  # seconds a draining pool waits for its running turns to finish
COLD_STOP_S = 4.0  # seconds for a cold stop (its job writes its ending) before SIGKILL
RESTART_BACKOFF_S = 1.0  # seconds before restarting a worker that died
RESTART_BACKOFF_MAX_S = 30.0  # the longest wait before restarting a worker that keeps dying young
YOUNG_WORKER_S = 5.0  # a worker that dies sooner after its start than this is crash-looping: backed off
RELAY_FINISH_S = 3.0  # seconds the relays get to write the stopped workers' last lines
HANDLE_START_TIMEOUT_S = 30.0  # seconds for a launched pool to say it is ready
HANDLE_STOP_TIMEOUT_S = 15.0  # seconds for a launched pool to stop its workers
# The status a worker exits with to be recycled (it held a tool thread that outlived its timeout).
RECYCLE_EXIT_CODE = 75  # EX_TEMPFAIL


class Pool:
    def __init__(self, workers: int, worker_class: str, env: dict[str, str], *, relay_output: bool = False):
        self.count = workers
        self.worker_class = worker_class
        self.env = env
        self.relay_output = relay_output  # the workers' output goes through the pool's rotated log
        self.relays: list[threading.Thread] = []
        self.procs: list[subprocess.Popen | None] = [None] * workers
        self.started_at: list[float] = [0.0] * workers
        self.backoff: list[float] = [0.0] * workers  # seconds a dead worker waits for its restart
        self.died_at: list[float | None] = [None] * workers  # when each dead worker was first seen dead
        self.names: list[str] = [""] * workers  # each worker's RQ name
        # Called with a dead worker's name and exit status as soon as it is seen dead (not to be recycled):
        # its turn is handed over then (deaths.py), not when its heartbeat lapses.
        self.on_death: Callable[[str, int | None], object] | None = None
        self.stopping = threading.Event()

    def spawn(self, index: int) -> None:
        name = self.names[index] = f"agent-{os.getpid()}-{index}-{uuid.uuid4().hex[:6]}"
        self.procs[index] = subprocess.Popen(
            [sys.executable, "-m", "agent.hosting.worker_process", "--with-parent",
             "--class", self.worker_class, "--name", name],
            env=self.env,
            stdin=subprocess.DEVNULL,
            # stdout is the pool's pipe to its parent: a worker's output goes to the log (or stderr)
            stdout=subprocess.PIPE if self.relay_output else sys.stderr,
            stderr=subprocess.STDOUT if self.relay_output else None,
            start_new_session=True,  # its own process group, stopped as a group
        )
        if self.relay_output:
            self.relays = [t for t in self.relays if t.is_alive()]
            self.relays.append(relay(self.procs[index].stdout, f"worker {index}"))
        self.started_at[index] = time.monotonic()

    def start(self) -> None:
        for index in range(self.count):
            self.spawn(index)

    def restart_dead(self) -> None:
        """Start a new worker for each that died: at once (RESTART_BACKOFF_S after its start at the soonest),
        or, for one that keeps dying young (a Redis that refuses its registration, a broken install), after
        a wait that doubles with each such death, up to RESTART_BACKOFF_MAX_S."""
        now = time.monotonic()
        for index, proc in enumerate(self.procs):
            if proc is None or proc.poll() is None or self.stopping.is_set():
                continue
            if self.died_at[index] is None:
                self.died_at[index] = now
                lived_s = now - self.started_at[index]
                if proc.returncode not in (0, RECYCLE_EXIT_CODE) and self.on_death is not None:
                    try:
                        self.on_death(self.names[index], proc.returncode)
                    except Exception:  # noqa: BLE001 - the supervisor outlives one bad hand-over; the watch remains
                        log.exception("worker %s died; handing its turn over failed", proc.pid)
                if proc.returncode == RECYCLE_EXIT_CODE:
                    self.backoff[index] = 0.0
                    log.info("worker %s stopped to be recycled (a tool thread outlived its timeout in it); "
                             "starting a fresh one", proc.pid)
                elif lived_s < YOUNG_WORKER_S:
                    self.backoff[index] = min(RESTART_BACKOFF_MAX_S, max(RESTART_BACKOFF_S, self.backoff[index] * 2))
                    log.warning("worker %s exited with %s %.1f s after it started; starting a new one in %g s",
                                proc.pid, proc.returncode, lived_s, self.backoff[index])
                else:
                    self.backoff[index] = 0.0
                    log.warning("worker %s exited with %s; starting a new one", proc.pid, proc.returncode)
            if now - self.died_at[index] < self.backoff[index] or now - self.started_at[index] < RESTART_BACKOFF_S:
                continue
            self.died_at[index] = None
            self.spawn(index)

    def stop(self, warm_s: float = WARM_STOP_S) -> None:
        """Warm stop, then cold stop (the running job writes its ending), then SIGKILL, per group.

        A warm stop lets a running turn finish; `warm_s` is how long it may take."""
        self.stopping.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for sig, grace in ((signal.SIGTERM, warm_s), (signal.SIGTERM, COLD_STOP_S), (signal.SIGKILL, 2.0)):
            for proc in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            end = time.monotonic() + grace
            while time.monotonic() < end and any(p.poll() is None for p in live):
                time.sleep(0.05)
            live = [p for p in live if p.poll() is None]
            if not live:
                break
        self.finish_relays()

    def finish_relays(self) -> None:
        """Let the relays write the workers' last lines (their pipes close once the workers and the
        servers they started are gone), for at most RELAY_FINISH_S in all."""
        end = time.monotonic() + RELAY_FINISH_S
        for thread in self.relays:
            thread.join(max(0.0, end - time.monotonic()))


@dataclass
class PoolHandle:
    """A running `python -m agent.hosting.pool` as seen by the process that started it."""

    proc: subprocess.Popen
    demo_url: str | None
    log_path: Path

    def stop(self, timeout_s: float = HANDLE_STOP_TIMEOUT_S) -> None:
        """SIGTERM the pool's group (it stops its workers), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


def launch(
    url: str,
    workers: int,
    *,
    log_path: Path,
    worker_class: str = "simple",
    env: dict[str, str] | None = None,
    demo: bool = True,
    drain: bool = False,
    start_timeout_s: float = HANDLE_START_TIMEOUT_S,
    log_max_bytes: int = LOG_MAX_BYTES,
    log_backups: int = LOG_BACKUPS,
) -> PoolHandle:
    """Start the pool as its own process (never a fork of the caller), tied to the caller's life.

    `env` adds to (or, with None values, removes from) this process's environment."""
    child_env = {**os.environ, "REDIS_URL": url, "PYTHONUNBUFFERED": "1"}
    child_env.pop("AGENT_DEMO_URL", None)  # the pool starts its own demo provider
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    command = [sys.executable, "-m", "agent.hosting.pool", "--workers", str(workers), "--class", worker_class,
               "--parent-pid", str(os.getpid()), "--log-file", str(log_path), "--log-max-bytes", str(log_max_bytes),
               "--log-backups", str(log_backups)]
    if not demo:
        command.append("--no-demo")
    if drain:
        command.append("--drain")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            command,
            env=child_env,
            cwd=str(PROJECT_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,  # what the pool says before its log is set up (and a crash's traceback)
            start_new_session=True,  # its own group: stopped as a group, untouched by a Ctrl-C to us
        )
    handle = PoolHandle(proc, None, log_path)
    line = _read_line(proc, start_timeout_s)
    proc.stdout.close()  # the pool prints one line: "ready <demo url>"
    if not line.startswith("ready"):
        handle.stop(timeout_s=2)
        raise RuntimeError(f"the worker pool did not start; see {log_path}")
    handle.demo_url = line.split(" ", 1)[1].strip() or None
    return handle


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The pool's first line, or "" if it says nothing in time (a thread, so a hung pool cannot hang us)."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline().decode()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else ""


def parent_alive(pid: int | None) -> bool:
    if pid is None:
        return True
    if os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def watch_turns(redis_url: str):
    """The watch that resumes turns whose worker was lost (turn_watch.py), on this Redis."""
    from agent.conversation.store import Store
    from agent.hosting.turn_watch import TurnWatch
    from agent.runtime.connection import queue_client, state_client
    from agent.settings import state_ttl_from_env

    return TurnWatch(Store(state_client(redis_url), state_ttl_from_env()), queue_client(redis_url)).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.hosting.pool")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--class", dest="worker_class", default="simple")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone")
    parser.add_argument("--no-demo", action="store_true", help="do not start the demo provider")
    parser.add_argument("--drain", action="store_true",
                        help=f"on stop, let running turns finish (up to {DRAIN_MAX_S:g} s) before stopping workers")
    parser.add_argument("--log-file", type=Path, help="write the log and the workers' output here, rotated by size")
    parser.add_argument("--log-max-bytes", type=int, default=LOG_MAX_BYTES, help="bytes in one log file")
    parser.add_argument("--log-backups", type=int, default=LOG_BACKUPS, help="rotated log files kept")
    args = parser.parse_args(argv)
    if args.log_file:
        log_to_rotating_file(args.log_file, args.log_max_bytes, args.log_backups)
    else:
        logging.basicConfig(level=logging.INFO, format=FORMAT)
    if not os.environ.get("REDIS_URL"):
        print("REDIS_URL: is required for the worker pool", file=sys.stderr)
        return 2

    env = dict(os.environ)
    demo = None
    if not args.no_demo and not env.get("AGENT_DEMO_URL"):
        from agent.demo.server import DemoServer

        demo = DemoServer().start()
        env["AGENT_DEMO_URL"] = demo.url
        log.info("demo provider on %s", demo.url)

    pool = Pool(args.workers, args.worker_class, env, relay_output=args.log_file is not None)
    signalled = record_stop_signals()
    pool.start()
    watch = watch_turns(env["REDIS_URL"])
    pool.on_death = watch.worker_died
    log.info("%d %s workers started", args.workers, args.worker_class)
    print(f"ready {env.get('AGENT_DEMO_URL', '')}", flush=True)
    try:
        while not signalled:
            time.sleep(WATCH_INTERVAL_S)  # a signal cuts it short
            if signalled:
                break
            if not parent_alive(args.parent_pid):
                log.info("parent %s is gone: stopping", args.parent_pid)
                break
            pool.restart_dead()
    finally:
        watch.stop()
        pool.stop(DRAIN_MAX_S if args.drain else WARM_STOP_S)
        if demo is not None:
            demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
