"""An answer names the request it answers (agent/cli/approvals.py, agent/turn/approvals.py): `approve ID
--request R` answers R and nothing else, a request answered earlier is said to be (by whom), a bare
`approve ID` shows the request on a terminal (a real pty) and asks y/N, and is refused without one.

Real Redis, the session's pool, a scripted model on loopback, the CLI as a subprocess.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from agent.contract import Outcome, Status
from agent.turn import approvals
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, ask, wait_done
from tests.scripted_server import chat_reply, tool_call
from tests.test_app import app_env  # noqa: F401 - the page's environment
from tests.test_approvals import parked, tool_results

PTY_WAIT_S = 60.0  # seconds a CLI under a pty gets to print its prompt (it starts Python and connects to Redis)


def two_asks(scripted):
    """A reply that asks to run two tools that each ask first, then an answer."""
    calls = [tool_call("calculator", {"expression": "1+1"}, "call_a"),
             tool_call("calculator", {"expression": "2+2"}, "call_b")]
    scripted.add(chat_reply(None, calls), chat_reply("both done"))
    return FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                             approve_tools=("calculator",))


@pytest.fixture
def cli(base_env, redis_url):
    env = {**base_env, "REDIS_URL": redis_url}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    run.env = env
    return run


def next_request(store, cid: str, after: str) -> dict:
    """The state once the turn waits on a request other than `after`."""
    return wait_for(lambda: (s := store.read(cid)) and s["status"] == Status.AWAITING_APPROVAL
                    and s["approval"]["id"] != after and s, 20, "the next request")


def test_approving_the_same_request_twice_never_answers_the_next_one(pool, store, queue, scripted, cli):
    cid = ask(store, queue, "two notes", two_asks(scripted))
    first = parked(store, cid)["approval"]
    assert first["call_id"] == "call_a"
    shown = cli("show", cid)
    assert f"request {first['id']}" in shown.stdout and f"--request {first['id']}" in shown.stdout
    approved = cli("approve", cid, "--request", first["id"])
    assert approved.returncode == 0, approved.stderr
    second = next_request(store, cid, first["id"])["approval"]
    assert second["call_id"] == "call_b"
    again = cli("approve", cid, "--request", first["id"])  # the same command, a second later
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert f"request {first['id']} to approve calculator was already answered: approved from the command line" \
        in again.stderr
    state = store.read(cid)
    assert state["status"] == Status.AWAITING_APPROVAL and state["approval"]["id"] == second["id"]
    assert not state["approval"]["answer"], "the second request is still waiting: nobody saw it"
    unknown = cli("deny", cid, "--request", "0123456789abcdef")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert f"the turn waits for request {second['id']}" in unknown.stderr
    denied = cli("deny", cid, "--request", second["id"])
    assert denied.returncode == 0, denied.stderr
    final = wait_done(store, cid)
    assert tool_results(final) == {"call_a": "2", "call_b": approvals.DENIED_RESULT}
    assert [s["request_id"] for s in final["steps"] if s["kind"] == "approval"] == [first["id"], second["id"]]
    late = cli("approve", cid, "--request", second["id"])
    assert late.returncode == 2 and "already answered: declined from the command line" in late.stderr


def test_a_bare_approve_without_a_terminal_is_refused_and_answers_nothing(pool, store, queue, cli):
    from tests.test_approvals import ASKS

    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    for command in ("approve", "deny"):
        refused = cli(command, cid)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert "--request" in refused.stderr and f"python -m agent show {cid}" in refused.stderr
    assert store.read(cid)["approval"]["answer"] is None
    bad = cli("approve", cid, "--request", "not-an-id")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    approvals.answer(store, queue, cid, Outcome.DENIED, approvals.BY_PAGE, request_id=request["id"])
    wait_done(store, cid)


def on_a_terminal(env: dict, *args: str, reply: str) -> tuple[int, str]:
    """Run the CLI with a real pty as its terminal; once it asks y/N, type `reply`. (exit status, output)"""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agent", *args], cwd=ROOT, env=env, stdin=child, stdout=child,
                            stderr=child, close_fds=True, start_new_session=True)
    os.close(child)
    output = b""
    try:
        deadline = time.monotonic() + PTY_WAIT_S
        while b"[y/N]" not in output and proc.poll() is None and time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                output += os.read(main, 65536)
        if b"[y/N]" in output:
            os.write(main, reply.encode() + b"\n")
        status = proc.wait(timeout=PTY_WAIT_S)
        while select.select([main], [], [], 0.2)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end closed: all is read
                break
            if not chunk:
                break
            output += chunk
        return status, output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)


def test_a_bare_approve_on_a_terminal_shows_the_request_and_asks_first(pool, store, queue, scripted, cli):
    cid = ask(store, queue, "two notes", two_asks(scripted))
    first = parked(store, cid)["approval"]
    status, output = on_a_terminal(cli.env, "approve", cid, reply="n")
    assert status == 1 and "Nothing was answered" in output, output
    assert f"request {first['id']}" in output and '"expression": "1+1"' in output
    assert store.read(cid)["approval"]["answer"] is None

    status, output = on_a_terminal(cli.env, "approve", cid, reply="y")
    assert status == 0, output
    assert "Approve this call" in output and "Approved: calculator" in output
    second = next_request(store, cid, first["id"])["approval"]
    status, output = on_a_terminal(cli.env, "deny", cid, reply="yes")
    assert status == 0 and f"request {second['id']}" in output and '"expression": "2+2"' in output, output
    final = wait_done(store, cid)
    assert tool_results(final) == {"call_a": "2", "call_b": approvals.DENIED_RESULT}


def test_a_button_drawn_for_one_request_never_answers_the_next(pool, store, queue, scripted, app_env):  # noqa: F811
    from tests.apptest_page import app, texts
    from tests.test_app import assert_no_exception

    cid = ask(store, queue, "two notes", two_asks(scripted))
    first = parked(store, cid)["approval"]
    at = app(cid)
    at.run()
    stale = at.button(key=f"approve-{first['id']}")
    # Answered elsewhere; the turn goes on and parks on the reply's second call.
    assert approvals.answer(store, queue, cid, Outcome.APPROVED, approvals.BY_CLI, request_id=first["id"]).taken
    second = next_request(store, cid, first["id"])["approval"]
    stale.click().run()  # the page still shows the first request's card
    assert_no_exception(at)
    assert "already answered: approved from the command line" in texts(at)
    state = store.read(cid)
    assert state["approval"]["id"] == second["id"] and state["approval"]["answer"] is None
    assert at.button(key=f"approve-{second['id']}"), "the page now shows the second request"
    approvals.answer(store, queue, cid, Outcome.DENIED, approvals.BY_PAGE, request_id=second["id"])
    wait_done(store, cid)
