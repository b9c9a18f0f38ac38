"""A Python tool that outlives its timeout does not degrade its worker: it is asked to stop at once,
and a worker that still holds it after the job is recycled (a fresh process takes its place), in
the embedded pool and in `python worker.py` alike."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from agent.tools.registry import REGISTRY, make_tool
from agent.tools.running import abandoned_tools, run_tool
from harness import pools
from harness.processes import alive
from harness.waiting import wait_for
from tests.conftest import ROOT, ask, start_pool, wait_done
from tests.scripted_server import chat_reply, tool_call
from tests.test_turn import scripted_config

TOOL_TIMEOUT_S = 1.0  # seconds a tool run gets in these turns
IDLE_CPU_PERCENT = 10.0  # a worker at rest uses next to nothing; a spinning thread took 28-100% here
PROMPT_TURN_S = 5.0  # seconds a one-call turn may take on a fresh or idle worker, with two CPU hogs running
RESTART_S = 60.0  # seconds for a recycled worker to be gone and its successor registered
FUZZ_SEED = 77
STUBBORN_SHAPES = ("stubborn", "sleepy", "swallow_once")  # survive the stop request: only recycling ends them


def tools_env(tmp_path) -> dict:
    return {"AGENT_TOOLS": "tests.spinning_tools", "SPIN_PID_FILE": str(tmp_path / "spin.pids")}


def holders(tmp_path) -> list[tuple[int, str]]:
    """(pid, shape) of every spin the tool started, in order."""
    path = tmp_path / "spin.pids"
    if not path.exists():
        return []
    return [(int(pid), shape) for pid, shape in (line.split() for line in path.read_text().splitlines())]


def spin_turn(redis_server, scripted, shape: str) -> dict:
    scripted.add(chat_reply(None, [tool_call("spin", {"shape": shape})]), chat_reply("it did not come back"))
    config = scripted_config(scripted, tool_timeout_cap_s=TOOL_TIMEOUT_S)
    cid = ask(redis_server.store, redis_server.queue, "spin", config)
    return wait_done(redis_server.store, cid, timeout_s=30)


def answers_promptly(redis_server, scripted) -> None:
    scripted.add(chat_reply("still quick"))
    started = time.monotonic()
    cid = ask(redis_server.store, redis_server.queue, "hello", scripted_config(scripted))
    state = wait_done(redis_server.store, cid, timeout_s=30)
    assert state["status"] == "done" and state["history"][-1]["content"] == "still quick"
    assert time.monotonic() - started < PROMPT_TURN_S


def registered_pids(redis_server) -> set[int]:
    """Pids of the workers registered with RQ on this Redis."""
    connection = redis_server.queue_connection
    return {int(pid) for key in connection.smembers("rq:workers") if (pid := connection.hget(key, "pid"))}


def cpu_percent(pid: int) -> float | None:
    """CPU use of the process over one second; None once it is gone."""
    try:
        return psutil.Process(pid).cpu_percent(interval=1.0)
    except psutil.Error:
        return None


def shapes_in_seeded_order() -> list[str]:
    shapes = [*STUBBORN_SHAPES, "plain"]
    random.Random(FUZZ_SEED).shuffle(shapes)
    return shapes


def test_a_worker_holding_a_tool_that_outlived_its_timeout_is_recycled_and_turns_stay_prompt(
        private_redis, scripted, tmp_path):
    handle = start_pool(private_redis.url, 1, tmp_path / "pool.log", extra_env=tools_env(tmp_path))
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 1)
        for shape in shapes_in_seeded_order():
            state = spin_turn(private_redis, scripted, shape)
            assert state["status"] == "done", state
            tool_answer = next(m for m in state["history"] if m["role"] == "tool")["content"]
            assert "did not finish within" in tool_answer and "abandoned" in tool_answer
            holder, held_shape = holders(tmp_path)[-1]
            assert held_shape == shape
            if shape in STUBBORN_SHAPES:
                # Recycled after the job's final write: the process, and its spinning thread, are gone.
                wait_for(lambda pid=holder: not alive(pid), RESTART_S, f"worker {holder} with a {shape} spin is gone")
                assert cpu_percent(holder) is None
                wait_for(lambda pid=holder: registered_pids(private_redis) - {pid}, RESTART_S, "a fresh worker")
            else:
                # Stopped by the exception raised in it: the worker stays, at rest.
                assert alive(holder)
                assert cpu_percent(holder) < IDLE_CPU_PERCENT
            pools.wait_for_workers(handle, private_redis.queue_connection, 1)
            answers_promptly(private_redis, scripted)
        log = handle.log_tail(20000)
        assert "recycling this worker" in log and "stopped to be recycled" in log
    finally:
        pools.stop_pool(handle, private_redis.url)


def test_worker_py_recycles_its_worker_too(private_redis, scripted, tmp_path):
    env = {**os.environ, **tools_env(tmp_path), "REDIS_URL": private_redis.url, "AGENT_MCP_CONFIG": "off",
           "OPENAI_API_KEY": "sk-test"}
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "worker.py", "--workers", "1"], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_for(lambda: private_redis.queue_connection.smembers("rq:workers"), RESTART_S, "a worker registers")
        state = spin_turn(private_redis, scripted, "stubborn")
        assert state["status"] == "done", state
        holder, _ = holders(tmp_path)[-1]
        wait_for(lambda: not alive(holder), RESTART_S, "the worker holding the spin is gone")
        wait_for(lambda: registered_pids(private_redis) - {holder}, RESTART_S, "a fresh worker registers")
        assert proc.poll() is None  # worker.py itself goes on, with a fresh worker
        answers_promptly(private_redis, scripted)
        assert "stopped to be recycled" in log_path.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# -- in this process: what run_tool does with a tool it gives up on ---------------------------------


def _bare_loop() -> str:
    """Loop until stopped from outside."""
    while True:
        pass


def test_an_abandoned_tool_thread_is_stopped_at_its_next_bytecode(monkeypatch):
    monkeypatch.setitem(REGISTRY, "bare_loop", make_tool(_bare_loop))
    result = run_tool("bare_loop", "{}", 0.3)
    assert not result.ok and "abandoned" in result.output
    # The exception raised in it ends a loop that does not swallow it: nothing is left to recycle.
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "tool-bare_loop"], 10,
             "the abandoned thread ends")
    assert "tool-bare_loop" not in abandoned_tools()


class JobTimeout(Exception):
    """What RQ's SIGALRM raises in the job's thread, here raised by the heartbeat."""


def test_a_tool_left_behind_by_the_job_timeout_is_abandoned_too(monkeypatch):
    monkeypatch.setitem(REGISTRY, "bare_loop", make_tool(_bare_loop))

    def job_timeout() -> None:
        raise JobTimeout

    with pytest.raises(JobTimeout):
        run_tool("bare_loop", "{}", 30, heartbeat=job_timeout)
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "tool-bare_loop"], 10,
             "the thread left behind ends")
