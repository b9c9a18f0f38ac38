"""`python -m agent list`, `show` and `export`, as subprocesses on the session's real Redis: what they
print, and exit codes as the rest of the CLI (0, or 2 with one line on stderr)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from agent.conversation.export import to_json
from agent.queue import new_id
from tests.conftest import ROOT
from tests.test_app import begin, make_done
from tests.test_cli import CLI_TIMEOUT_S, cli, one_line


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
    assert json.loads(cli(env, "show", cid, "--json").stdout) == {**store.read(cid), "branches": store.branches(cid)}
    from agent.conversation import tree

    whole = tree.whole(store.redis, cid, store.branches(cid))
    assert json.loads(cli(env, "export", cid, "--format", "json").stdout) == json.loads(to_json(store.read(cid), whole))
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
                                  ("export", "../etc/passwd"), ("list", "--limit", "0")])
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
    from agent.cli.main import EXIT_ENDED_BADLY, Follower
    from agent.queue import new_id, submit_turn
    from agent.settings import Settings

    cid = new_id()
    turn_id = submit_turn(store, queue, cid, "What is 17*23?", Settings.from_env({}).turn)  # no worker takes it
    store.delete(cid)
    follower = Follower(store, queue.connection, queue, cid, turn_id, poll_interval_ms=200, as_json=False)
    assert follower.step() == EXIT_ENDED_BADLY
    assert "the conversation was deleted before the turn ended" in capsys.readouterr().err


def test_export_without_a_format_writes_markdown(store, env, tmp_path):
    cid = conversation(store)
    printed = cli(env, "export", cid)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.decode().startswith("# What is 17\\*23?\n") and "**Assistant:**" in printed.stdout.decode()
    out = tmp_path / "c.md"
    assert cli(env, "export", cid, "--output", str(out)).returncode == 0
    assert out.read_text().startswith("# What is 17\\*23?\n")


def refused(run: subprocess.CompletedProcess, words: str) -> None:
    assert run.returncode == 2 and run.stdout == b"", run.stderr
    assert words in one_line(run.stderr)


def test_an_output_that_cannot_be_written_exits_2_with_one_line_and_writes_nothing(store, env, tmp_path):
    cid = conversation(store)
    before = sorted(os.listdir(tmp_path))
    refused(cli(env, "export", cid, "--output", str(tmp_path)), "is a folder")
    refused(cli(env, "export", cid, "--output", str(tmp_path / "missing" / "c.md")), "does not exist")
    refused(cli(env, "export", cid, "--output", "/dev/full"), "no space left on device")
    assert sorted(os.listdir(tmp_path)) == before
    with open("/dev/full", "wb") as full:  # and a full disk behind stdout
        run = subprocess.run([sys.executable, "-m", "agent", "export", cid], env=env, cwd=ROOT, stdout=full,
                             stderr=subprocess.PIPE, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert run.returncode == 2 and "standard output: no space left on device" in one_line(run.stderr)


def test_an_output_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(store, env, tmp_path):
    cid = conversation(store)
    target = tmp_path / "someone-elses-file"
    target.write_text("kept")
    link = tmp_path / "c.md"
    link.symlink_to(target)
    refused(cli(env, "export", cid, "--output", str(link)), "symbolic link")
    assert target.read_text() == "kept" and link.is_symlink()
    dangling = tmp_path / "d.md"
    dangling.symlink_to(tmp_path / "not-yet")
    refused(cli(env, "export", cid, "--output", str(dangling)), "symbolic link")
    assert not (tmp_path / "not-yet").exists()


FILE_SIZE_LIMIT_BYTES = 300  # less than any export: the write fails part-way, as on a full disk


def test_a_write_that_fails_part_way_leaves_the_file_as_it_was(store, env, tmp_path):
    cid = conversation(store, answer="x" * 2000)
    out = tmp_path / "c.md"
    out.write_text("the export before")
    before = sorted(os.listdir(tmp_path))
    # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE fails with EFBIG, part-way, as ENOSPC would.
    run = subprocess.run([sys.executable, "-m", "agent", "export", cid, "--output", str(out)], env=env, cwd=ROOT,
                         capture_output=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES,) * 2))
    refused(run, "nothing was written")
    assert out.read_text() == "the export before"
    assert sorted(os.listdir(tmp_path)) == before  # no partial file left beside it
