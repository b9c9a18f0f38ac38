"""Embedded services: started once per process, shared where they should be, and stopped cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agent.hosting import services
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.settings import Settings
from harness.processes import alive, processes_with_env
from harness.waiting import wait_for
from tests.conftest import ROOT


def wait_gone(name: str, value: str, timeout_s: float = 15.0) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        left = processes_with_env(name, value)
        if not left:
            return []
        time.sleep(0.1)
    return processes_with_env(name, value)


@pytest.fixture
def private_env(tmp_path, monkeypatch):
    """A private data dir (its own embedded Redis); a marker to find every child process."""
    marker = f"test-{time.time_ns()}"
    monkeypatch.setenv("AGENT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AGENT_TEST_MARKER", marker)
    monkeypatch.delenv("REDIS_URL", raising=False)
    yield marker
    for pid in processes_with_env("AGENT_TEST_MARKER", marker):
        os.kill(pid, signal.SIGKILL)
    # Redis rewrites its process title over its environment, so the marker cannot find it: its pid file can.
    EmbeddedRedis(tmp_path / "data").stop()


def test_the_pool_starts_once_per_process_and_stops_with_its_workers(private_env):
    settings = Settings.from_env({"AGENT_WORKERS": "2"})
    try:
        first = services.ensure(settings)
        second = services.ensure(settings)  # a Streamlit rerun or a second session
        assert first is second
        assert first.pool is not None and first.pool.proc.poll() is None
        assert first.demo_url.startswith("http://127.0.0.1:")
        # the pool and its 2 workers (Redis rewrites its own environ for its process title)
        wait_for(lambda: len(processes_with_env("AGENT_TEST_MARKER", private_env)) >= 3, 30, "the pool and workers")
        assert len(processes_with_env("AGENT_TEST_MARKER", private_env)) == 3
        redis_pid = first.embedded.pid
        assert redis_pid is not None
    finally:
        services.shutdown()
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []
    assert not alive(redis_pid)  # gone, or a zombie its parent has not reaped yet


def test_a_module_reload_does_not_start_a_second_pool(private_env):
    import importlib

    settings = Settings.from_env({"AGENT_WORKERS": "1"})
    namespace = dict(vars(services))  # reload re-runs the module in place: its classes are put back after
    try:
        first = services.ensure(settings)
        reloaded = importlib.reload(services)  # what a Streamlit hot reload does to an edited module
        assert reloaded.ensure(settings).pool.proc.pid == first.pool.proc.pid
    finally:
        services.shutdown()
        vars(services).update(namespace)  # later tests catch the ServiceError they imported
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []


def test_the_cli_answers_and_leaves_no_process_behind(private_env):
    result = subprocess.run(
        [sys.executable, "-m", "agent", "ask", "What is 17*23?"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "391" in result.stdout
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []
    assert EmbeddedRedis().pid is None  # the last user stopped the embedded Redis


@pytest.mark.parametrize("worker_class", ["simple", "fork", "spawn"])
def test_external_workers_from_worker_py_run_turns_for_a_cli_without_workers(private_env, tmp_path, worker_class):
    worker = subprocess.Popen(
        [sys.executable, "worker.py", "--workers", "1", "--class", worker_class],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "w.log", "wb"),
        start_new_session=True,
    )
    try:
        env = {**os.environ, "AGENT_WORKERS": "0"}
        result = subprocess.run(
            [sys.executable, "-m", "agent", "ask", "--json", "What is 6*7?"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr + (tmp_path / "w.log").read_text()
        assert '"done": true' in result.stdout.splitlines()[-1]
        assert "42" in result.stdout.splitlines()[-1]
    finally:
        os.killpg(worker.pid, signal.SIGINT)
        worker.wait(20)
    assert worker.returncode == 0
    assert "Traceback" not in (tmp_path / "w.log").read_text(), "its workers stopped cleanly"
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []


def test_a_cli_whose_turn_no_worker_takes_says_how_to_start_one(private_env, tmp_path):
    stderr_path = tmp_path / "cli.err"
    with open(stderr_path, "wb") as stderr:
        cli = subprocess.Popen([sys.executable, "-m", "agent", "ask", "hi"], cwd=ROOT,
                               env={**os.environ, "AGENT_WORKERS": "0"}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        said = wait_for(lambda: "waiting for a worker" in stderr_path.read_text(), 30, "the hint")
        assert said and "python worker.py" in stderr_path.read_text()
        assert cli.poll() is None  # it still waits: a worker started now would take the turn
    finally:
        os.killpg(cli.pid, signal.SIGTERM)  # as Ctrl-C; a suite run in the background ignores SIGINT
        try:
            cli.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(cli.pid, signal.SIGKILL)  # nothing is left behind, even by a CLI that hung on its way out
            cli.wait(10)
            raise
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []


def test_a_draining_pool_lets_a_running_turn_finish_before_it_stops(private_env, tmp_path):
    from agent.conversation.store import Store
    from agent.hosting.pool import launch
    from agent.queue import get_queue, new_id, submit_turn
    from agent.runtime.connection import queue_client, state_client
    from tests.conftest import FAST

    server = EmbeddedRedis()
    url = server.acquire()
    handle = launch(url, 1, log_path=tmp_path / "pool.log", drain=True)
    try:
        store = Store(state_client(url), ttl_s=600)
        cid = new_id()
        submit_turn(store, get_queue(queue_client(url)), cid, "What is 2*21?",
                    FAST.with_changes(model="demo@1.0", job_timeout_s=10))
        wait_for(lambda: store.read_meta(cid)["status"] == "running", 30, "the turn runs")
        assert store.read_meta(cid)["status"] == "running"
        handle.stop(timeout_s=30)  # the pool is asked to stop while the turn runs
        state = store.read(cid)
        assert state["done"] and state["status"] == "done", state["history"][-1]
        assert "42" in state["history"][-1]["content"]
    finally:
        handle.stop()
        server.stop()


def test_a_cli_without_workers_says_so_and_a_sigterm_stops_it_cleanly(private_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_WORKERS", "0")
    err_path = tmp_path / "cli.err"
    with open(err_path, "wb") as err:
        cli = subprocess.Popen([sys.executable, "-m", "agent", "ask", "hi"], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=err, start_new_session=True)
    try:
        # The turn stays queued until the CLI has said that no worker runs: wait for those words.
        deadline = time.monotonic() + 60
        while "none is running" not in err_path.read_text() and time.monotonic() < deadline:
            assert cli.poll() is None, err_path.read_text()
            time.sleep(0.1)
        assert EmbeddedRedis().pid is not None
        cli.terminate()
        cli.wait(timeout=20)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    stderr = err_path.read_text()
    assert "none is running" in stderr and "python worker.py" in stderr
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []
    assert EmbeddedRedis().pid is None  # its Redis stopped with it


def test_a_killed_pool_is_started_again_and_its_running_turn_resumed(private_env):
    """The page's server starts its pool again when the pool is killed; the new pool's watch resumes the
    turn the dead one's worker was running, inside its clocks, and its workers take the next message."""
    from agent.queue import get_queue, worker_counts
    from tests.conftest import FAST, ask, wait_done
    from tests.test_resume import read_when, running

    slow = FAST.with_changes(model="demo@3~0", job_timeout_s=30, deadline_margin_s=4.0, call_timeout_cap_s=10.0)
    settings = Settings.from_env({"AGENT_WORKERS": "1"})
    try:
        started = services.ensure(settings)
        store, queue = started.store(settings), get_queue(started.queue_connection())
        cid = ask(store, queue, "hello", slow)
        read_when(store, cid, running, 30, "the turn runs")
        killed = started.pool.proc.pid
        os.kill(killed, signal.SIGKILL)  # its worker dies with it (PR_SET_PDEATHSIG), and its watch
        wait_for(lambda: started.pool.proc.pid != killed and started.pool_restarts == 1, 30, "a new pool")
        final = wait_done(store, cid, 40)
        assert final["status"] == "done", (final["status"], final["error"])
        assert [s["attempt"] for s in final["steps"] if s["kind"] == "resume"] == [1]
        assert final["updated_at"] < final["job_timeout_at"]
        assert wait_for(lambda: worker_counts(queue) == (1, 0), 10, "the new pool's worker counted, idle")
        assert wait_done(store, ask(store, queue, "What is 6*7?", FAST), 30)["status"] == "done"
    finally:
        services.shutdown()
    assert wait_gone("AGENT_TEST_MARKER", private_env) == []
