"""A finished conversation outlives the app: stopped normally (its embedded Redis stopped and started
again from its files), by Ctrl-C, and by SIGKILL of every process, Redis included. Real CLI processes
on the embedded Redis in a data directory of the test's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from agent.runtime.embedded_redis import EmbeddedRedis
from harness.waiting import wait_for
from tests.conftest import ROOT

CLI_TIMEOUT_S = 90  # seconds for one CLI run (it starts Redis and a worker)
EVENT_TIMEOUT_S = 45  # seconds to wait for a turn to reach a state


def env_for(base_env: dict, **extra: str) -> dict:
    return {**base_env, "AGENT_WORKERS": "1", "AGENT_JOB_TIMEOUT": "30", "AGENT_DEADLINE_MARGIN": "5", **extra}


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


def finished_conversation(env: dict) -> str:
    done = cli(env, "ask", "What is 6*6?")
    assert done.returncode == 0, done.stderr
    return done.stderr.split("conversation ", 1)[1].split(",", 1)[0]


def stored(env: dict, cid: str) -> dict:
    shown = cli(env, "show", cid, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def assert_intact(env: dict, cid: str) -> None:
    state = stored(env, cid)
    assert state["done"] and state["status"] == "done"
    assert state["history"][0]["content"] == "What is 6*6?" and "36" in state["history"][-1]["content"]
    listed = cli(env, "list", "--json")
    assert cid in [json.loads(line)["conversation_id"] for line in listed.stdout.splitlines()]


def app_mid_turn(env: dict) -> tuple[subprocess.Popen, list[int]]:
    """A CLI (the app's services: Redis and a worker) with a slow turn in flight; its process tree."""
    proc = subprocess.Popen([sys.executable, "-m", "agent", "ask", "What time is it in Tokyo?"],
                            env={**env, "AGENT_MODEL": "demo@3"}, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    line = proc.stderr.readline().decode()  # "conversation X, turn Y": the turn was sent
    assert line.startswith("conversation "), line
    tree = wait_for(lambda: [c.pid for c in psutil.Process(proc.pid).children(recursive=True)], EVENT_TIMEOUT_S,
                    "the worker pool runs")
    return proc, tree


def redis_pid(env: dict) -> int:
    return wait_for(lambda: EmbeddedRedis(Path(env["AGENT_DATA_DIR"])).pid, EVENT_TIMEOUT_S, "Redis runs")


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_finished_conversation_survives_the_app_stopping_and_its_redis_restarting(base_env):
    env = env_for(base_env)
    cid = finished_conversation(env)  # the CLI stopped its Redis on exit
    assert EmbeddedRedis(Path(env["AGENT_DATA_DIR"])).pid is None
    assert_intact(env, cid)  # a new Redis, started from the files the old one left


def test_a_finished_conversation_survives_ctrl_c_of_the_app_mid_turn(base_env):
    env = env_for(base_env)
    cid = finished_conversation(env)
    proc, tree = app_mid_turn(env)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        assert proc.wait(timeout=CLI_TIMEOUT_S) == 130
    finally:
        _kill_all([proc.pid, *tree])
        proc.stderr.close()
    assert_intact(env, cid)


def test_a_finished_conversation_survives_sigkill_of_every_process_redis_included(base_env):
    env = env_for(base_env)
    cid = finished_conversation(env)
    proc, tree = app_mid_turn(env)
    server = redis_pid(env)
    try:
        _kill_all([proc.pid, *tree, server])
        proc.wait(timeout=CLI_TIMEOUT_S)
        wait_for(lambda: not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE,
                 EVENT_TIMEOUT_S, "Redis is gone")
    finally:
        _kill_all([proc.pid, *tree])
        proc.stderr.close()
    assert_intact(env, cid)
