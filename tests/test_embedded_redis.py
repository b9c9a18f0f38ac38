"""The embedded Redis (shared by every project process, stopped by the last one) and REDIS_URL
with a password and with TLS (`rediss://`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from agent.hosting.services import ServiceError, check_redis
from agent.runtime.connection import describe, is_memory_error, redis_problem, state_client
from agent.runtime.embedded_redis import EmbeddedRedis, redis_binary
from harness.private_redis import PrivateRedis
from harness.processes import alive, processes_running
from tests.conftest import ROOT

STOP_WAIT_S = 10.0  # seconds for a released server to be gone

USER_SCRIPT = """
import sys
from agent.runtime.embedded_redis import EmbeddedRedis
server = EmbeddedRedis(sys.argv[1])
server.acquire()
print(server.pid, flush=True)
for line in sys.stdin:
    if line.strip() == "release":
        server.release()
        print("released", flush=True)
    elif line.strip() == "exit":
        break
"""


class User:
    """Another Python process using the embedded Redis in `directory`."""

    def __init__(self, directory: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", USER_SCRIPT, str(directory)], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
        self.server_pid = int(self.proc.stdout.readline())

    def release(self) -> None:
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"

    def exit(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def wait_dead(pid: int, timeout_s: float = STOP_WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def servers_for(directory: Path) -> list[int]:
    """Live redis-server processes started on this directory's config."""
    return processes_running(str(directory / "redis.conf"))


@pytest.fixture
def shared_dir(tmp_path):
    directory = tmp_path / "shared"
    users: list[User] = []
    yield directory, users
    for user in users:
        user.exit()
    EmbeddedRedis(directory).stop()
    for pid in servers_for(directory):
        os.kill(pid, signal.SIGKILL)


def test_two_processes_share_one_server_and_the_last_to_leave_stops_it(shared_dir):
    directory, users = shared_dir
    first = User(directory)
    users.append(first)
    second = User(directory)
    users.append(second)
    assert first.server_pid == second.server_pid
    server = EmbeddedRedis(directory)
    first.release()
    assert alive(first.server_pid)
    client = redis.Redis(unix_socket_path=str(server.socket), password=server.password, socket_timeout=2)
    try:
        assert client.ping()
    finally:
        client.close()
    second.release()
    assert wait_dead(second.server_pid)
    assert servers_for(directory) == []


def test_a_user_that_was_killed_does_not_keep_the_server_alive(shared_dir):
    directory, users = shared_dir
    crashed = User(directory)
    users.append(crashed)
    os.killpg(crashed.proc.pid, signal.SIGKILL)
    crashed.proc.wait(5)
    survivor = User(directory)
    users.append(survivor)
    assert survivor.server_pid == crashed.server_pid  # joined, not restarted
    survivor.release()
    assert wait_dead(survivor.server_pid)
    assert servers_for(directory) == []


def test_stop_leaves_no_process_and_a_restart_keeps_the_data(tmp_path):
    server = EmbeddedRedis(tmp_path / "r")
    try:
        url = server.acquire()
        client = state_client(url)
        client.set("kept", "yes")
        client.close()
        pid = server.pid
        server.stop()
        assert wait_dead(pid)
        assert servers_for(server.dir) == []
        assert server.pid is None
        client = state_client(server.acquire())  # same directory: the AOF brings the data back
        try:
            assert client.get("kept") == b"yes"
        finally:
            client.close()
    finally:
        server.stop()
    assert servers_for(server.dir) == []


# -- REDIS_URL: a password, and TLS --------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def tcp_redis(tmp_path):
    """A second redis-server binary on a loopback TCP port, with a password."""
    password = secrets.token_urlsafe(16)
    port = free_port()
    proc = subprocess.Popen(
        [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password, "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1)
        end = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        client.close()
        yield port, password
    finally:
        proc.kill()
        proc.wait(5)


def test_a_redis_url_with_a_password_works(tcp_redis):
    port, password = tcp_redis
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    check_redis(url)
    client = state_client(url)
    try:
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
    finally:
        client.close()
    assert password not in describe(url)


def test_a_wrong_password_is_refused_in_words_that_do_not_repeat_it(tcp_redis):
    port, _ = tcp_redis
    url = f"redis://:not-the-password@127.0.0.1:{port}/0"
    with pytest.raises(ServiceError) as caught:
        check_redis(url)
    assert "password" in str(caught.value)
    assert "not-the-password" not in str(caught.value)


def _supports_tls() -> bool:
    out = subprocess.run([redis_binary(), "--tls-port", "0", "--port", "0", "--test-memory", "0"],
                         capture_output=True, text=True, timeout=10)
    return "Bad directive" not in out.stdout + out.stderr and "FATAL" not in out.stdout + out.stderr


class TLSProxy:
    """TLS on 127.0.0.1, forwarding to a plain TCP Redis: `rediss://` without a TLS-built server."""

    def __init__(self, cert: Path, key: Path, target_port: int):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                client = self.context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.close()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.thread.join(timeout=2)


@pytest.fixture
def tls_endpoint(tcp_redis, tmp_path):
    """(port, password, CA file) of a TLS endpoint for the TCP Redis."""
    port, password = tcp_redis
    if _supports_tls():
        pytest.skip("the bundled redis-server supports TLS; this test covers the proxy case only")
    if shutil.which("openssl") is None:
        pytest.skip("no TLS in the bundled redis-server and no `openssl` CLI to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    proxy = TLSProxy(cert, key, port)
    try:
        yield proxy.port, password, cert
    finally:
        proxy.stop()


@pytest.mark.parametrize("verify", ["ca_file", "no_verification"])
def test_a_rediss_url_works(tls_endpoint, verify):
    port, password, cert = tls_endpoint
    query = f"ssl_ca_certs={cert}" if verify == "ca_file" else "ssl_cert_reqs=none"
    url = f"rediss://:{password}@127.0.0.1:{port}/0?{query}"
    check_redis(url)
    client = state_client(url)
    try:
        client.set("over-tls", verify)
        assert client.get("over-tls") == verify.encode()
    finally:
        client.close()


def test_a_rediss_url_to_an_untrusted_certificate_is_refused(tls_endpoint):
    port, password, _ = tls_endpoint
    with pytest.raises(ServiceError) as caught:
        check_redis(f"rediss://:{password}@127.0.0.1:{port}/0")
    assert "unreachable" in str(caught.value)


def test_a_stale_pid_file_naming_another_process_is_never_signalled(tmp_path):
    import subprocess
    import sys

    from agent.runtime.embedded_redis import EmbeddedRedis

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server = EmbeddedRedis(tmp_path / "data")
        server.dir.mkdir(parents=True)
        server.pid_file.write_text(str(bystander.pid))  # left behind; the pid now belongs to someone else
        assert server.pid is None
        server.stop()
        url = server.acquire()
        assert url.startswith("unix://")
        assert bystander.poll() is None  # untouched
        server.stop()
    finally:
        bystander.kill()
        bystander.wait()


def test_the_embedded_redis_holds_at_most_its_maxmemory_and_evicts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_REDIS_MAXMEMORY_MB", "64")
    with PrivateRedis(tmp_path / "redis") as server:
        assert server.client.config_get("maxmemory")["maxmemory"] == str(64 * 1024 * 1024)
        assert server.client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        server.client.config_set("maxmemory", "1")  # full: a write is refused, in words a person can act on
        for write in (lambda: server.client.set("k", "v"),  # a plain write, and one inside a script
                      lambda: server.client.eval("return redis.call('SET', KEYS[1], 'v')", 1, "k")):
            with pytest.raises(redis.ResponseError) as refused:
                write()
            assert is_memory_error(refused.value) and "Redis is full" in redis_problem(refused.value)
