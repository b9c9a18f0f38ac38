"""`python -m agent ask`: exit codes 0/1/2, one-line errors, and odd messages at the edge."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from agent.queue import MAX_MESSAGE_CHARS, BadMessage, clean_message, job_id_for, new_id
from tests.conftest import FAST, ROOT

CLI_TIMEOUT_S = 30  # seconds for any one CLI run
FAST_CLOCKS = {
    "AGENT_JOB_TIMEOUT": "6",
    "AGENT_DEADLINE_MARGIN": "2",
    "AGENT_CALL_TIMEOUT_CAP": "3",
    "AGENT_CONNECT_TIMEOUT": "1",
    "AGENT_MIN_CALL_SECONDS": "0.5",
}


@pytest.fixture
def base_env(tmp_path):
    """The environment without any agent or provider setting, and a private data dir."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENT_", "OPENAI_", "ANTHROPIC_")) and k != "REDIS_URL"}
    env["AGENT_DATA_DIR"] = str(tmp_path / "data")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def cli_env(base_env, redis_url, pool):
    """The session's Redis and workers (the pool), none started by the CLI itself."""
    return {**base_env, **FAST_CLOCKS, "REDIS_URL": redis_url, "AGENT_WORKERS": "0"}


def cli(env: dict, *args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, capture_output=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


def one_line(stderr: bytes) -> str:
    text = stderr.decode(errors="replace")
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- Redis unreachable at start --------------------------------------------------------------


def test_redis_unreachable_at_start_exits_2_with_one_line_that_hides_the_password(base_env):
    url = f"redis://:hunter2-secret@127.0.0.1:{closed_port()}/0"
    started = time.monotonic()
    result = cli({**base_env, "REDIS_URL": url}, "ask", "hi")
    assert time.monotonic() - started < 30  # gives up, instead of waiting for a Redis that never comes
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "unreachable" in line and "127.0.0.1" in line
    assert "hunter2-secret" not in line


def test_a_missing_unix_socket_exits_2(base_env, tmp_path):
    result = cli({**base_env, "REDIS_URL": f"unix://{tmp_path}/nothing.sock"}, "ask", "hi")
    assert result.returncode == 2
    assert "unreachable" in one_line(result.stderr)


def test_a_wrong_redis_password_exits_2_and_says_so(base_env, redis_url):
    wrong = re.sub(r"password=[^&]+", "password=wrong-guess", redis_url)
    result = cli({**base_env, "REDIS_URL": wrong, "AGENT_WORKERS": "0"}, "ask", "hi")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "password" in line and "wrong-guess" not in line


# -- bad environment values ------------------------------------------------------------------


BAD_ENV = [
    ({"AGENT_JOB_TIMEOUT": "abc"}, "AGENT_JOB_TIMEOUT"),
    ({"AGENT_JOB_TIMEOUT": "0"}, "AGENT_JOB_TIMEOUT"),
    ({"AGENT_JOB_TIMEOUT": "1e400"}, "AGENT_JOB_TIMEOUT"),
    ({"AGENT_JOB_TIMEOUT": "-5"}, "AGENT_JOB_TIMEOUT"),
    ({"AGENT_DEADLINE_MARGIN": "500"}, "AGENT_DEADLINE_MARGIN"),
    ({"AGENT_DEADLINE_MARGIN": "0"}, "AGENT_DEADLINE_MARGIN"),
    ({"AGENT_CALL_TIMEOUT_CAP": "nan"}, "AGENT_CALL_TIMEOUT_CAP"),
    ({"AGENT_CONNECT_TIMEOUT": "0"}, "AGENT_CONNECT_TIMEOUT"),
    ({"AGENT_MIN_CALL_SECONDS": "100"}, "AGENT_MIN_CALL_SECONDS"),
    ({"AGENT_MAX_STEPS": "0"}, "AGENT_MAX_STEPS"),
    ({"AGENT_MAX_STEPS": "2.5"}, "AGENT_MAX_STEPS"),
    ({"AGENT_STATE_TTL": "forever"}, "AGENT_STATE_TTL"),
    ({"AGENT_POLL_INTERVAL_MS": "10"}, "AGENT_POLL_INTERVAL_MS"),
    ({"AGENT_WORKERS": "-1"}, "AGENT_WORKERS"),
    ({"AGENT_PROVIDER": "gpt-4"}, "AGENT_PROVIDER"),
    ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"),
    ({"AGENT_PROVIDER": "openai"}, "OPENAI_API_KEY"),
    ({"AGENT_PROVIDER": "anthropic"}, "ANTHROPIC_API_KEY"),
    ({"AGENT_PROVIDER": "openai", "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "ftp://x"}, "OPENAI_BASE_URL"),
]


@pytest.mark.parametrize(("changes", "variable"), BAD_ENV, ids=[f"{v}-{i}" for i, (_, v) in enumerate(BAD_ENV)])
def test_a_bad_environment_value_is_refused_in_one_line_naming_the_variable(base_env, changes, variable):
    result = cli({**base_env, **changes}, "ask", "hi")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert variable in line
    assert result.stdout == b""


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("ask",), ("ask", "--nope", "hi"), ("tell", "hi")], ids=str)
def test_bad_usage_exits_2_with_one_line(base_env, args):
    result = cli(base_env, *args)
    assert result.returncode == 2
    one_line(result.stderr)


# -- odd messages -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    ["", "   \n\t  ", "\x01\x02\x1b\x7f\x08", "x" * (MAX_MESSAGE_CHARS + 1)],
    ids=["empty", "blank", "control-only", "too-long"],
)
def test_a_message_that_cannot_be_sent_exits_2_and_nothing_is_enqueued(cli_env, redis_client, message):
    queued_before = redis_client.llen("rq:queue:agent-turns")
    result = cli(cli_env, "ask", "--conversation", "odd-" + new_id(), message)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "Nothing was sent" in line or "not sent" in line
    assert redis_client.llen("rq:queue:agent-turns") <= queued_before


def _states(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]


def test_a_binary_message_is_sent_with_its_bad_bytes_marked_not_a_traceback(cli_env):
    # Regression: bytes that are not UTF-8 reach Python's argv as lone surrogates, which Redis
    # cannot encode: the CLI died with a UnicodeEncodeError traceback.
    result = cli(cli_env, "ask", "--json", b"\xff\xfe\x80 What is 2+2?")
    assert b"Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0
    states = _states(result.stdout)
    user = states[-1]["history"][0]
    assert user["role"] == "user"
    assert user["content"] == "\ufffd\ufffd\ufffd What is 2+2?"


def test_control_characters_are_stripped_and_the_turn_runs(cli_env):
    result = cli(cli_env, "ask", "--json", "What is\x07 2+2?\x1b[31m\x08")
    assert result.returncode == 0, result.stderr
    content = _states(result.stdout)[-1]["history"][0]["content"]
    assert content == "What is 2+2?[31m"


def test_a_message_of_exactly_the_limit_is_accepted(cli_env):
    message = ("2+2 " * MAX_MESSAGE_CHARS)[:MAX_MESSAGE_CHARS - 1] + "?"
    result = cli(cli_env, "ask", "--json", message)
    assert result.returncode in (0, 1), result.stderr
    assert len(_states(result.stdout)[-1]["history"][0]["content"]) == MAX_MESSAGE_CHARS


def test_clean_message_refuses_nul_and_other_controls_that_argv_cannot_carry():
    with pytest.raises(BadMessage):
        clean_message("\x00\x00")
    with pytest.raises(BadMessage):
        clean_message(None)
    assert clean_message("a\x00b\u0085c\ud800") == "ab\u0085c\ufffd"


# -- exit codes of a turn that ran ------------------------------------------------------------


def test_json_output_is_one_state_a_line_ending_done_and_exit_0(cli_env):
    result = cli(cli_env, "ask", "--json", "What is 17*23?")
    assert result.returncode == 0, result.stderr
    states = _states(result.stdout)
    versions = [s["version"] for s in states]
    assert versions == sorted(set(versions))
    assert states[-1]["done"] and states[-1]["status"] == "done"
    assert not any(s["done"] for s in states[:-1])
    assert "391" in states[-1]["history"][-1]["content"]


def test_a_turn_that_runs_out_of_time_exits_1(cli_env):
    started = time.monotonic()
    result = cli({**cli_env, "AGENT_MODEL": "demo:hang"}, "ask", "hello")
    assert result.returncode == 1
    # Bounded by the job timeout, with room for a CLI that starts slowly on a busy machine.
    assert time.monotonic() - started < int(FAST_CLOCKS["AGENT_JOB_TIMEOUT"]) + 20
    assert "[timed_out]" in result.stderr.decode()


def test_a_message_to_a_conversation_with_a_turn_in_flight_exits_1_in_one_line(cli_env, store):
    cid, tid = "busy-" + new_id(), new_id()
    doc = {"status": "queued", "error": None, "config": FAST.to_dict(), "job_id": job_id_for(tid),
           "enqueued_at": time.time(), "deadline_at": None, "job_timeout_at": None, "started_at": None,
           "current_step": None}
    store.begin_turn(cid, tid, {"role": "user", "content": "first"}, doc)  # in flight, never enqueued
    result = cli(cli_env, "ask", "--conversation", cid, "second")
    assert result.returncode == 1
    assert "still being written" in one_line(result.stderr)
    assert [m["content"] for m in store.read(cid)["history"]] == ["first"]
