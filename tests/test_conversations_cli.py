"""`python -m agent list`, `show` and `export`, as subprocesses on the session's real Redis: what they
print, and exit codes as the rest of the CLI (0, or 2 with one line on stderr)."""

from __future__ import annotations

import json

import pytest

from agent.export import to_json
from agent.queue import new_id
from tests.test_app import begin, make_done
from tests.test_cli import cli, one_line


@pytest.fixture
def env(base_env, redis_url):
    return {**base_env, "REDIS_URL": redis_url, "AGENT_WORKERS": "0"}


def conversation(store, question="What is 17*23?", answer="17*23 = 391") -> str:
    cid, turn_id = begin(store, question)
    make_done(store, cid, turn_id, answer)
    return cid


def test_list_prints_the_conversations_most_recent_first_as_text_and_json(store, env):
    token = new_id()  # the session's Redis holds other tests' conversations too
    older = conversation(store, f"What is 2+2? {token}")
    newer = conversation(store, "Bell \x07 and \x1b[2J escape")
    text = cli(env, "list")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.decode().splitlines()
    ids = [line.split()[0] for line in lines]
    assert ids.index(newer) < ids.index(older)
    assert "\x1b" not in text.stdout.decode() and "\x07" not in text.stdout.decode()  # printed terminal-safe
    rows = [json.loads(line) for line in cli(env, "list", "--json").stdout.decode().splitlines()]
    row = next(r for r in rows if r["conversation_id"] == older)
    assert row["title"] == f"What is 2+2? {token}" and row["turns"] == 1 and row["in_flight"] is False
    filtered = cli(env, "list", "--json", "--filter", token.upper())
    assert [json.loads(line)["conversation_id"] for line in filtered.stdout.decode().splitlines()] == [older]


def test_show_and_export_print_the_conversation_and_the_json_is_the_stored_state(store, env, tmp_path):
    cid = conversation(store)
    shown = cli(env, "show", cid)
    assert shown.returncode == 0 and "What is 17*23?" in shown.stdout.decode() and "391" in shown.stdout.decode()
    assert json.loads(cli(env, "show", cid, "--json").stdout) == store.read(cid)
    assert json.loads(cli(env, "export", cid, "--format", "json").stdout) == json.loads(to_json(store.read(cid)))
    out = tmp_path / "c.md"
    written = cli(env, "export", cid, "--format", "md", "--output", str(out))
    assert written.returncode == 0 and written.stdout == b""
    markdown = out.read_text()
    assert "What is 17*23?" in markdown and "calculator" in markdown and "17*23 = 391" in markdown


@pytest.mark.parametrize("args", [("show", "NOPE"), ("export", "NOPE", "--format", "md"), ("show", "DELETED")])
def test_an_unknown_or_deleted_id_exits_2_with_one_line(store, env, args):
    deleted = conversation(store)
    store.delete(deleted)
    args = tuple(deleted if a == "DELETED" else new_id() if a == "NOPE" else a for a in args)
    run = cli(env, *args)
    assert run.returncode == 2
    line = one_line(run.stderr)
    assert ("was deleted" in line) if args[1] == deleted else ("was not found" in line and "30 days" in line)


@pytest.mark.parametrize("args", [("show", "../etc/passwd"), ("export", "abc", "--format", "pdf"),
                                  ("export", "abc"), ("list", "--limit", "0")])
def test_bad_usage_exits_2_with_one_line(env, args):
    run = cli(env, *args)
    assert run.returncode == 2
    one_line(run.stderr)


def test_ask_following_a_turn_whose_conversation_is_deleted_exits_1_saying_so(store, base_env, redis_url, pool):
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.test_cli import FAST_CLOCKS

    env = {**base_env, **FAST_CLOCKS, "REDIS_URL": redis_url, "AGENT_WORKERS": "0", "AGENT_MODEL": "demo@2"}
    proc = subprocess.Popen([sys.executable, "-m", "agent", "ask", "What is 17*23?"], env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stderr.readline().decode()
        cid = first.split("conversation ", 1)[1].split(",", 1)[0]
        store.delete(cid)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    assert "the conversation was deleted before the turn ended" in err.decode()
    assert store.read(cid) is None


def test_a_conversation_deleted_before_the_clis_first_read_ends_the_follow_saying_so(store, queue, capsys):
    """The turn is sent, then its conversation is deleted before the CLI has read it once: the CLI's
    first wait finds no version at all, and must not wait for one forever."""
    from agent.cli import EXIT_ENDED_BADLY, Follower
    from agent.queue import new_id, submit_turn
    from agent.settings import Settings

    cid = new_id()
    turn_id = submit_turn(store, queue, cid, "What is 17*23?", Settings.from_env({}).turn)  # no worker takes it
    store.delete(cid)
    follower = Follower(store, queue.connection, queue, cid, turn_id, poll_interval_ms=200, as_json=False)
    assert follower.step() == EXIT_ENDED_BADLY
    assert "the conversation was deleted before the turn ended" in capsys.readouterr().err
