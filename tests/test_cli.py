"""`python -m agent ask`: exit codes 0/1/2, one-line errors, and odd messages at the edge."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import pytest

from agent.queue import MAX_MESSAGE_CHARS, BadMessage, clean_message, job_id_for, new_id
from agent.tools.catalogue import CATALOGUE_KEY
from harness.pools import wait_for_workers
from harness.waiting import wait_for
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
def cli_env(base_env, redis_url, pool, redis_client):
    """The session's Redis and workers (the pool), none started by the CLI itself; once its workers have
    registered and published their tools, so that what a test counts or lists is not still arriving."""
    wait_for_workers(pool, redis_client, 2)
    wait_for(lambda: redis_client.exists(CATALOGUE_KEY), 30, "the workers' tool catalogue")
    return {**base_env, **FAST_CLOCKS, "AGENT_MODEL": FAST.model, "REDIS_URL": redis_url, "AGENT_WORKERS": "0"}


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
    ({"AGENT_STATE_TTL": "3"}, "AGENT_STATE_TTL"),
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


@pytest.mark.parametrize("args", [(), ("ask",), ("ask", "--nope", "hi"), ("tell", "hi"),
                                  ("ask", "--tools", "calc ulator", "hi"), ("tools", "--nope")], ids=str)
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


def test_tools_names_the_only_tools_the_turn_may_use(cli_env):
    result = cli(cli_env, "ask", "--json", "--tools", "current_time,search_docs", "What is 17*23?")
    assert result.returncode == 0, result.stderr
    final = _states(result.stdout)[-1]
    assert not [s for s in final["steps"] if s["kind"] == "tool"]  # the calculator was not offered
    assert "calculator" in final["history"][-1]["content"]  # the demo model says what it could not do


def test_tools_lists_what_the_workers_published_marking_the_tools_that_ask_first(cli_env):
    result = cli({**cli_env, "AGENT_APPROVE_TOOLS": "calculator,no_such_tool"}, "tools")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.decode().splitlines()}
    assert rows["add_note"] == ["built-in", "asks", "first"]  # it says so itself
    assert rows["calculator"] == ["built-in", "asks", "first"]  # AGENT_APPROVE_TOOLS names it
    assert rows["wait"] == ["built-in"]
    assert one_line(result.stderr) == "AGENT_APPROVE_TOOLS names tools no worker offers: no_such_tool"
    as_json = cli(cli_env, "tools", "--json")
    assert as_json.returncode == 0 and as_json.stderr == b""
    listed = {row["name"]: row for row in map(json.loads, as_json.stdout.decode().splitlines())}
    assert listed["add_note"]["needs_approval"] is True and listed["calculator"]["needs_approval"] is False
    assert set(listed["wait"]) == {"name", "source", "description", "needs_approval"}


def test_tools_before_any_worker_published_lists_the_built_ins_and_says_so(base_env, private_redis):
    result = cli({**base_env, "REDIS_URL": private_redis.url, "AGENT_WORKERS": "0"}, "tools")
    assert result.returncode == 0, result.stderr
    assert "no worker has published its tools yet" in one_line(result.stderr)
    names = [line.split()[0] for line in result.stdout.decode().splitlines()]
    assert names == ["calculator", "current_time", "search_docs", "wait", "add_note"]
    assert result.stdout.decode().splitlines()[-1].endswith("asks first")


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


# -- the conversation id ----------------------------------------------------------------------


def bad_conversation_ids() -> list[str]:
    """Generated variants of every class of id the rule must refuse."""
    import random

    rng = random.Random(8)
    ok = "abcXYZ019_-"
    ids = ["", "\n", "a" * 65, "a" * 10_000, "abc\n", "\nabc", "ab\rc", "ab\x00c", "ab\x1b[31mc", "a b", "a\tb"]
    ids += ["../../etc/passwd", "..", ".", "/", "a/b", "a\\b", "~root", "%2e%2e%2f", "a:b", "agent:conv:x:meta"]
    ids += ["*", "?", "[a-z]", "a*", "agent:*", "{a,b}", "$(id)", "`id`", "a;rm", "a|b", "'a'", '"a"', "a&b"]
    ids += ["é", "ａｂｃ", "abc\u200b", "\u202eabc", "abc\ufffd", "日本", "a\udcff", "\udc80\udcfe", "\ud800"]
    for _ in range(200):  # a valid id with one bad character somewhere, or one too long
        core = "".join(rng.choice(ok) for _ in range(rng.randint(1, 63)))
        bad = rng.choice("./\\*?[]{}$`;|&:'\" \n\r\t\x00\x7f~%éß\u2028\udcff")
        at = rng.randint(0, len(core))
        ids.append(core[:at] + bad + core[at:])
        ids.append("".join(rng.choice(ok) for _ in range(rng.randint(65, 300))))
    return ids


def test_the_conversation_id_rule_refuses_every_generated_bad_id_and_accepts_good_ones():
    import random

    from agent.conversation.keys import is_conversation_id

    assert not any(is_conversation_id(cid) for cid in bad_conversation_ids())
    assert not is_conversation_id(None) and not is_conversation_id(b"abc")
    rng = random.Random(9)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
    good = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 64))) for _ in range(500)]
    assert all(is_conversation_id(cid) for cid in good + [new_id(), "a", "-", "_" * 64])


def test_a_bad_conversation_id_exits_2_with_one_ascii_line_before_anything_starts(capsys):
    # Regression: `--conversation` took anything (`../../etc/passwd`, `*`, 10 KB, newlines) as a key.
    from agent.cli.main import main

    for cid in bad_conversation_ids():
        with pytest.raises(SystemExit) as exit_info:
            main(["ask", f"--conversation={cid}", "hi"])
        assert exit_info.value.code == 2, cid
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.isascii(), err
        assert "not a conversation id" in err and len(err) < 300


@pytest.mark.parametrize(
    "cid",
    [b"\xff\xfe", b"abc\xc3", b"../../etc/passwd", b"a\nb", b"*", b"x" * 10_000, b""],
    ids=["not-utf8", "cut-utf8", "traversal", "newline", "glob", "10KB", "empty"],
)
def test_a_bad_conversation_id_from_the_real_argv_is_one_line_and_exit_2(cli_env, redis_client, cid):
    # No conversation is created. Keys of conversations already there may come and go meanwhile: the session's
    # workers renew marks of their own (one that lapsed on a busy machine comes back), and a turn an earlier
    # test left in flight is ended by the watch, which writes its keys. So the measure is the conversations.
    def conversations() -> set[bytes]:
        return {key.rsplit(b":", 1)[0] for key in redis_client.scan_iter(match="agent:conv:*", count=1000)}

    conversations_before = conversations()
    result = cli(cli_env, "ask", "--conversation", cid, "hi")
    assert result.returncode == 2
    assert "not a conversation id" in one_line(result.stderr)
    assert result.stdout == b""
    assert conversations() <= conversations_before


def test_an_unknown_conversation_id_exits_2_and_creates_nothing(cli_env, store):
    # Regression: an unknown id quietly started a new conversation under that id.
    cid = "unknown-" + new_id()
    result = cli(cli_env, "ask", "--conversation", cid, "hi")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "not found" in line and cid in line and "nothing was sent" in line
    assert store.version(cid) is None


def test_a_known_conversation_continues_and_prints_only_the_new_turn(cli_env):
    first = cli(cli_env, "ask", "--json", "What is 17*23?")
    assert first.returncode == 0, first.stderr
    cid = _states(first.stdout)[-1]["conversation_id"]
    second = cli(cli_env, "ask", "--conversation", cid, "What is 6*7?")
    assert second.returncode == 0, second.stderr
    out = second.stdout.decode()
    assert "42" in out and "391" not in out


# -- plain text and deltas --------------------------------------------------------------------


def test_the_answer_is_printed_as_plain_text_without_markdown_markers(cli_env):
    # Regression: the demo's `**17*23 = 391**` was printed with its asterisks.
    result = cli(cli_env, "ask", "What is 17*23?")
    assert result.returncode == 0, result.stderr
    answer = result.stdout.decode().splitlines()[-1]
    assert "17*23 = 391" in answer and "**" not in answer


def test_json_lines_are_deltas_that_rebuild_the_final_state(cli_env):
    result = cli(cli_env, "ask", "--json", "What is 17*23?")
    assert result.returncode == 0, result.stderr
    lines = _states(result.stdout)
    assert len(lines) >= 3
    assert all(line["delta"] for line in lines[:-1]) and lines[-1]["delta"] is False
    rebuilt = {"history": [], "steps": [], "turns": []}
    for line in lines[:-1]:
        for name in rebuilt:
            assert line[f"{name}_from"] == len(rebuilt[name])
            rebuilt[name] += line[f"new_{name}"]
            assert name not in line
    final = lines[-1]
    for name in rebuilt:
        assert final[name][: len(rebuilt[name])] == rebuilt[name]
    assert {k for k in lines[0] if not k.startswith(("new_", "history_", "steps_", "turns_", "live_"))} <= set(final)


SHORT_ROUNDS, LONG_ROUNDS = 3, 12  # model round-trips, each asking for the most tool calls one response may run
GROWTH_SLACK = 1.6  # printed bytes per step may grow this much from the short turn to the long one


def run_flood_turn(env: dict, rounds: int) -> tuple[int, dict]:
    """A turn of `rounds` responses of many tool calls, then an answer: (bytes printed, final state)."""
    from agent.turn.response_limits import MAX_TOOL_CALLS_PER_RESPONSE
    from tests.scripted_server import ScriptedServer, chat_reply, tool_call

    calls = [tool_call("calculator", {"expression": f"{i}+1"}, f"call_{i}") for i in range(MAX_TOOL_CALLS_PER_RESPONSE)]
    with ScriptedServer([chat_reply(None, calls)] * (rounds - 1) + [chat_reply("**all done**")]) as server:
        result = cli({**env, "AGENT_PROVIDER": "openai", "AGENT_MODEL": "scripted", "AGENT_JOB_TIMEOUT": "60",
                      "AGENT_DEADLINE_MARGIN": "10", "OPENAI_BASE_URL": server.url + "/v1",
                      "AGENT_MAX_STEPS": str(rounds)}, "ask", "--json", "add them up")
    assert result.returncode == 0, result.stderr
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["done"] and final["status"] == "done"
    return len(result.stdout), final


def test_json_output_grows_linearly_with_the_steps_of_a_turn(cli_env):
    # Regression: every version printed the whole state, so a turn of 10,000 steps printed 191 MB.
    short_bytes, short = run_flood_turn(cli_env, SHORT_ROUNDS)
    long_bytes, long = run_flood_turn(cli_env, LONG_ROUNDS)
    assert len(long["steps"]) >= 3 * len(short["steps"])
    per_step_short = short_bytes / len(short["steps"])
    per_step_long = long_bytes / len(long["steps"])
    assert per_step_long < GROWTH_SLACK * per_step_short, (per_step_short, per_step_long)
    # And in absolute terms: a few times the final state, not the final state once per version.
    assert long_bytes < 4 * len(json.dumps(long))


def test_nothing_a_terminal_would_act_on_reaches_it_from_a_reply_a_tool_or_its_arguments(cli_env):
    # A reply can carry escape sequences (ESC ] 0; retitles the window, ESC [ 2J clears the screen,
    # C1's CSI does the same in one byte) and bidirectional overrides: each is printed as its escape.
    from agent.text.plain_text import TERMINAL_ACTIVE
    from tests.scripted_server import ScriptedServer, chat_reply, tool_call

    active = "".join(map(chr, TERMINAL_ACTIVE))
    hostile = f"\x1b]0;owned\x07\x1b[2J\x9b31m{active}"
    calls = [tool_call("calculator", {"expression": f"1+1 {hostile}"}, "call_1"), tool_call(f"calc{hostile}", {}, "c2")]
    for mode in ([], ["--json"]):
        with ScriptedServer([chat_reply(None, calls), chat_reply(f"**done** {hostile}")]) as server:
            result = cli({**cli_env, "AGENT_PROVIDER": "openai", "AGENT_MODEL": "scripted",
                          "OPENAI_BASE_URL": server.url + "/v1"}, "ask", *mode, "add them up")
        assert result.returncode == 0, result.stderr
        out = result.stdout.decode()
        assert "done" in out and "owned" in out, out  # the text itself is shown
        assert not set(active) & set(out.replace("\n", "")), sorted(set(active) & set(out))
        if mode:
            assert "\x1b]0;owned" in json.loads(out.splitlines()[-1])["history"][-1]["content"]  # escaped, not lost
        else:
            assert "\\x1b]0;owned\\x07" in out


# -- streamed replies -------------------------------------------------------------------------


def test_a_streamed_reply_is_printed_while_it_is_written_with_its_tokens(cli_env, store):
    from tests.scripted_server import ScriptedServer
    from tests.sse_stream import reply_stream

    words = [f"word{i} " for i in range(12)]
    with ScriptedServer([reply_stream(words, pause_s=0.4)]) as server:
        env = {**cli_env, "AGENT_PROVIDER": "openai", "AGENT_MODEL": "scripted", "AGENT_JOB_TIMEOUT": "30",
               "AGENT_DEADLINE_MARGIN": "5", "AGENT_CALL_TIMEOUT_CAP": "20", "OPENAI_BASE_URL": server.url + "/v1"}
        with subprocess.Popen([sys.executable, "-m", "agent", "ask", "talk"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
            try:
                cid = proc.stderr.readline().decode().split()[1].rstrip(",")
                first = proc.stdout.read(len("word0 word1 "))  # printed before the reply is whole
                state = store.read(cid)
                out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
            finally:
                proc.kill()
    assert first == b"word0 word1 "
    assert not state["done"] and state["history"][-1]["role"] == "user", state
    assert proc.returncode == 0, err
    assert (first + out).decode() == "".join(words) + "\n"
    assert "[model call 1: 42 tokens in, 7 out]" in err.decode()
    assert "[tokens this turn: 42 in, 7 out, over 1 model call]" in err.decode()


def test_json_live_deltas_reassemble_to_the_final_message(cli_env):
    from tests.scripted_server import ScriptedServer
    from tests.sse_stream import reply_stream

    words = [f"wörd{i} " for i in range(30)]
    with ScriptedServer([reply_stream(words, pause_s=0.1)]) as server:
        result = cli({**cli_env, "AGENT_PROVIDER": "openai", "AGENT_MODEL": "scripted", "AGENT_JOB_TIMEOUT": "30",
                      "AGENT_DEADLINE_MARGIN": "5", "AGENT_CALL_TIMEOUT_CAP": "20",
                      "OPENAI_BASE_URL": server.url + "/v1"}, "ask", "--json", "talk")
    assert result.returncode == 0, result.stderr
    lines = _states(result.stdout)
    text = ""
    for line in lines[:-1]:
        if line["live"]:
            assert "text" not in line["live"] and line["live_from"] <= len(text)
            text = text[: line["live_from"]] + line["live_delta"]
    assert sum(1 for line in lines if line.get("live")) >= 2
    assert text == "".join(words) == lines[-1]["history"][-1]["content"]
    assert lines[-1]["live"] is None and lines[-1]["steps"][-1]["usage"] == {"input_tokens": 42, "output_tokens": 7}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_lands_inside_a_finaliser_still_stops_the_cli():
    """Python may run the SIGINT handler inside any finaliser, where its KeyboardInterrupt is dropped:
    the follow loop still stops at its next step."""
    import gc
    import signal

    from agent.cli import main as cli

    class Finaliser:
        def __del__(self):
            cli._interrupt(signal.SIGINT, None)

    try:
        Finaliser()  # collected at once: the KeyboardInterrupt is printed as ignored, and lost
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            cli.raise_if_interrupted()
    finally:
        cli._interrupted.clear()
    cli.raise_if_interrupted()  # nothing pending: it returns
