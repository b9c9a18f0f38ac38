"""An embedded Redis that runs but does not answer (stopped, busy, loading its data, a socket that
accepts and never replies) is waited for and never replaced: its pid stays, and nothing written
before is lost. Only a server whose pid is gone, or is not our server, is replaced."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from agent.runtime.embedded_redis import PING_TIMEOUT_S, EmbeddedRedis, RedisNotAnswering
from harness.processes import alive
from harness.waiting import wait_for
from tests.conftest import ROOT

KEYS_WRITTEN = 500  # keys written before the stall, every one of which must still be there after it
SHORT_WAIT_S = 2.0  # seconds of AGENT_REDIS_WAIT where a test wants the give-up
LONG_WAIT_S = 60.0  # seconds of AGENT_REDIS_WAIT where a test wants the wait to outlast the stall
MARGIN_S = 1.5  # seconds of slack on a time bound
CLI_TIMEOUT_S = 90.0  # seconds for a whole CLI run, pool start and turn included


@pytest.fixture
def server(tmp_path):
    """The page's embedded Redis, started by this process, with KEYS_WRITTEN keys in it."""
    embedded = EmbeddedRedis(tmp_path / "data")
    embedded.acquire()
    client = _client(embedded)
    client.mset({f"before-{i}": str(i) for i in range(KEYS_WRITTEN)})
    client.close()
    try:
        yield embedded
    finally:
        pid = embedded.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        embedded.stop()


def _client(embedded: EmbeddedRedis, socket_path: Path | None = None) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(socket_path or embedded.socket), password=embedded.password,
                       socket_timeout=10)


def assert_intact(embedded: EmbeddedRedis, pid: int) -> None:
    """The same server, alive, with every key written before the stall."""
    assert embedded.pid == pid and alive(pid)
    client = _client(embedded)
    try:
        values = client.mget([f"before-{i}" for i in range(KEYS_WRITTEN)])
    finally:
        client.close()
    assert values == [str(i).encode() for i in range(KEYS_WRITTEN)]


def cli_env(embedded: EmbeddedRedis, wait_s: float, base_env: dict) -> dict:
    return {**base_env, "AGENT_DATA_DIR": str(embedded.dir), "AGENT_REDIS_WAIT": str(wait_s)}


# -- the CLI against a stopped server ----------------------------------------------------------


def test_a_cli_waits_for_a_stopped_server_then_fails_in_one_line_leaving_it_running(server, base_env):
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "agent", "ask", "What is 17*23?"], cwd=ROOT,
                            env=cli_env(server, SHORT_WAIT_S, base_env), capture_output=True, text=True,
                            timeout=CLI_TIMEOUT_S)
    took_s = time.monotonic() - started
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert f"the embedded Redis (pid {pid}) is not answering" in lines[0] and "waiting" in lines[0]
    assert lines[-1].startswith(f"error: the embedded Redis (pid {pid}) did not answer within")
    assert "left running" in lines[-1] and f"kill -CONT {pid}" in lines[-1]
    assert [line for line in lines if line.startswith("error")] == [lines[-1]]
    assert "Traceback" not in result.stderr
    assert took_s >= SHORT_WAIT_S
    assert psutil.Process(pid).status() == psutil.STATUS_STOPPED  # untouched: still ours to continue
    os.kill(pid, signal.SIGCONT)
    assert_intact(server, pid)


def test_a_cli_that_waits_for_a_stopped_server_answers_once_it_is_continued(server, base_env, tmp_path):
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)
    err_path = tmp_path / "cli.err"
    with open(err_path, "wb") as err:
        cli = subprocess.Popen([sys.executable, "-m", "agent", "ask", "What is 17*23?"], cwd=ROOT,
                               env=cli_env(server, LONG_WAIT_S, base_env), stdout=subprocess.PIPE, stderr=err,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        wait_for(lambda: "is not answering" in err_path.read_text(), 30, "the CLI says it waits")
        assert cli.poll() is None and alive(pid)
        os.kill(pid, signal.SIGCONT)
        out, _ = cli.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait(10)
    stderr = err_path.read_text()
    assert cli.returncode == 0, stderr
    assert "391" in out
    assert f"the embedded Redis (pid {pid}) answers again" in stderr
    assert_intact(server, pid)


# -- every stall shape, at the level of acquire --------------------------------------------------


class FakeSocket:
    """Takes the server's socket path while the real one is moved aside: a listener that answers
    every command with -LOADING (a server loading a large data file) or accepts and never answers."""

    def __init__(self, embedded: EmbeddedRedis, mode: str):
        self.path = embedded.socket
        self.aside = self.path.with_name(self.path.name + ".aside")
        os.rename(self.path, self.aside)
        self.mode = mode
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(self.path))
        self.listener.listen(16)
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                if self.mode == "loading":
                    conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")

    def end(self) -> None:
        """The stall ends: the real server's socket is back."""
        self.listener.close()
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.rename(self.aside, self.path)


class Stall:
    """One way for a live server not to answer, started and ended by the test."""

    def __init__(self, embedded: EmbeddedRedis, shape: str, busy_s: float):
        self.embedded, self.shape, self.pid = embedded, shape, embedded.pid
        self.fake: FakeSocket | None = None
        self.sleeper: threading.Thread | None = None
        if shape == "stopped":
            os.kill(self.pid, signal.SIGSTOP)
            wait_for(lambda: psutil.Process(self.pid).status() == psutil.STATUS_STOPPED, 10, "the server stopped")
        elif shape == "busy":  # the real server inside a long command: it accepts, and answers no one
            client = _client(embedded)
            client.connection_pool.connection_kwargs["socket_timeout"] = busy_s + 30
            self.sleeper = threading.Thread(target=lambda: client.execute_command("DEBUG", "SLEEP", busy_s))
            self.sleeper.start()
            time.sleep(0.2)  # the DEBUG SLEEP is on the wire before anyone else asks
        else:
            self.fake = FakeSocket(embedded, shape)

    def end(self) -> None:
        if self.shape == "stopped":
            os.kill(self.pid, signal.SIGCONT)
        elif self.sleeper is not None:
            self.sleeper.join(60)
        if self.fake is not None:
            self.fake.end()


SHAPES = ("stopped", "busy", "loading", "silent")
FUZZ_SEED = 20261202
FUZZ_RUNS = 8


def fuzz_cases() -> list[tuple[str, bool, float]]:
    """(shape, does it end before the wait does, when it ends): each shape both ways, in a seeded order."""
    rng = random.Random(FUZZ_SEED)
    cases = [(shape, in_time) for shape in SHAPES for in_time in (True, False)]
    rng.shuffle(cases)
    return [(shape, in_time, rng.uniform(0.5, 1.5)) for shape, in_time in cases[:FUZZ_RUNS]]


@pytest.mark.parametrize(("shape", "ends_in_time", "ends_after_s"), fuzz_cases())
def test_a_live_server_that_does_not_answer_is_waited_for_and_never_replaced(server, shape, ends_in_time,
                                                                             ends_after_s):
    pid = server.pid
    wait_s = ends_after_s + PING_TIMEOUT_S + 6.0 if ends_in_time else SHORT_WAIT_S
    # A command shorter than one PING's timeout is a slow answer, not a stall.
    busy_s = PING_TIMEOUT_S + ends_after_s if ends_in_time else SHORT_WAIT_S + PING_TIMEOUT_S + 1.0
    said: list[str] = []
    stall = Stall(server, shape, busy_s)
    ended = threading.Timer(ends_after_s, stall.end) if ends_in_time and shape != "busy" else None
    joiner = EmbeddedRedis(server.dir)  # another process's view of the same server
    started = time.monotonic()
    try:
        if ended is not None:
            ended.start()
        if ends_in_time:
            url = joiner.acquire(wait_s=wait_s, say=said.append)
            assert url == server.url
        else:
            with pytest.raises(RedisNotAnswering) as caught:
                joiner.acquire(wait_s=wait_s, say=said.append)
            took_s = time.monotonic() - started
            assert wait_s <= took_s <= wait_s + PING_TIMEOUT_S + MARGIN_S  # the bound, plus one PING's timeout
            assert f"(pid {pid}) did not answer" in str(caught.value) and "left running" in str(caught.value)
            assert alive(pid) and server.pid == pid  # still running, still the server of record
    finally:
        if ended is not None:
            ended.join()
        else:
            stall.end()
    assert any(f"(pid {pid}) is not answering" in line for line in said), said
    assert_intact(server, pid)
    joiner.release()


def test_a_server_whose_pid_is_gone_is_replaced_and_keeps_its_data(server):
    pid = server.pid
    os.kill(pid, signal.SIGKILL)  # gone for good (this test process reaps its child)
    wait_for(lambda: not alive(pid), 10, "the server is gone")
    joiner = EmbeddedRedis(server.dir)
    said: list[str] = []
    joiner.acquire(wait_s=SHORT_WAIT_S, say=said.append)
    assert joiner.pid not in (None, pid)
    assert not said  # a replacement is not a stall
    server.stop()  # the new one, by its pid file


def test_a_pid_file_naming_another_projects_redis_is_never_signalled(server, tmp_path):
    other = EmbeddedRedis(tmp_path / "other")
    other.acquire()
    try:
        other_pid = other.pid
        server.stop()
        server.pid_file.write_text(str(other_pid))  # a redis-server, but not on our socket: pid reuse
        fresh = EmbeddedRedis(server.dir)
        fresh.acquire(wait_s=SHORT_WAIT_S)
        assert fresh.pid not in (None, other_pid)
        assert alive(other_pid) and other.pid == other_pid
        fresh.stop()
    finally:
        other.stop()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_redis_wait_is_refused_naming_its_variable(value):
    from agent.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"AGENT_REDIS_WAIT": value})
    assert "AGENT_REDIS_WAIT" in str(caught.value)


def test_the_page_shows_a_stopped_server_in_words_and_works_once_it_is_continued(server, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from agent.hosting import services

    pid = server.pid
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("AGENT_DATA_DIR", str(server.dir))
    monkeypatch.setenv("AGENT_WORKERS", "0")
    monkeypatch.setenv("AGENT_REDIS_WAIT", str(SHORT_WAIT_S))
    services.shutdown()  # the services of an earlier test in this process, if any
    st.cache_resource.clear()
    os.kill(pid, signal.SIGSTOP)
    try:
        page = AppTest.from_file(str(ROOT / "app.py"), default_timeout=CLI_TIMEOUT_S)
        page.run()
        assert not page.exception
        shown = " ".join(e.value for e in page.error)
        assert "could not start its services" in shown
        assert f"the embedded Redis (pid {pid}) did not answer" in shown and "left running" in shown
        assert psutil.Process(pid).status() == psutil.STATUS_STOPPED
        os.kill(pid, signal.SIGCONT)
        page.run()  # a reload: a failed start is not cached
        assert not page.exception and not page.error
        assert_intact(server, pid)
    finally:
        os.kill(pid, signal.SIGCONT)
        services.shutdown()
        st.cache_resource.clear()


def test_the_last_user_leaving_a_stopped_server_does_not_kill_it_and_it_shuts_down_once_continued(server):
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)
    server.release()  # this process was its only user
    assert alive(pid) and server.pid == pid  # not killed; its pid file still names it
    os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not alive(pid), 30, "the server shuts down by itself once continued")
    server.acquire(wait_s=SHORT_WAIT_S)  # a fresh server, on the same files
    assert_intact(server, server.pid)
