"""A closed pipe ends a command quietly, as for any Unix tool (`python -m agent list | head -2`): no
"error:" line, no traceback, exit status 141 (what a shell reports for a tool its closed pipe stopped)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from agent.cli.main import EXIT_READER_LEFT
from tests.conftest import ROOT, ask
from tests.test_app import begin, make_done
from tests.test_approvals import ASKS, parked
from tests.test_cli import CLI_TIMEOUT_S, cli, cli_env  # noqa: F401

CONVERSATION = "{cid}"  # stands for a stored conversation's id in a command below
PARKED = "{parked}"  # for a conversation whose turn waits for an approval
REQUEST = "{request}"  # the id of its request
TURN = "{turn}"  # the stored conversation's turn
COMMANDS = [
    ("branches", CONVERSATION), ("branches", CONVERSATION, "--json"), ("switch", CONVERSATION, TURN),
    ("regenerate", CONVERSATION), ("edit", CONVERSATION, TURN, "What is 3+3?", "--json"),
    ("list",), ("list", "--json"),
    ("show", CONVERSATION), ("show", CONVERSATION, "--json"),
    ("export", CONVERSATION), ("export", CONVERSATION, "--format", "json"),
    ("tools",), ("tools", "--json"),
    ("ask", "What is 2+2?"), ("ask", "--json", "What is 2+2?"),
    ("approve", PARKED, "--request", REQUEST), ("deny", PARKED, "--request", REQUEST),
]


def closed_stdout(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader has already left: its first line fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, stdout=write_end,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S, text=True)
    finally:
        os.close(write_end)


def test_every_command_is_tried_in_a_closed_pipe(base_env):
    usage = cli(base_env, "--help").stdout.decode()
    commands = set(re.search(r"\{([a-z,]+)\}", usage).group(1).split(","))
    assert commands == {command[0] for command in COMMANDS}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_command_whose_reader_left_ends_quietly(cli_env, store, queue, command):  # noqa: F811
    cid, turn_id = begin(store)
    make_done(store, cid, turn_id, "**17*23 = 391**")
    args = [cid if part == CONVERSATION else turn_id if part == TURN else part for part in command]
    if PARKED in command:
        waiting = ask(store, queue, "what is 6*7?", ASKS)
        request = parked(store, waiting)["approval"]["id"]
        args = [waiting if part == PARKED else request if part == REQUEST else part for part in args]
    result = closed_stdout(cli_env, *args)
    assert "error" not in result.stderr.lower() and "Traceback" not in result.stderr, result.stderr
    assert result.returncode == EXIT_READER_LEFT, result.stderr
    if PARKED in command:  # the answer was given: only its line was not read
        assert store.read(args[1])["approval"]["answer"] in ("approved", "denied")
