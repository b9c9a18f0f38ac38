"""Tools that ask a person first: the turn parks on a request for approval, frees its worker, and goes on
in a new job once the request is approved, denied or expires (agent/turn/approvals.py).

Real Redis, real RQ workers (the session's pool, whose supervisor's watch expires requests), the demo
model or a scripted model on loopback. Tests wait for events (the state's version), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from agent.contract import Outcome, Status
from agent.queue import job_status
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.turn import approvals
from agent.turn.approvals import BY_CLI, BY_PAGE, DENIED_RESULT
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, ask, wait_done
from tests.scripted_server import chat_reply, tool_call
from tests.test_resume import SLOW_CALL, assert_every_call_answered_once, worker_running, workers  # noqa: F401

ASKS = FAST.with_changes(approve_tools=("calculator",))
PARK_WITHIN_S = 10.0  # seconds a test waits for a turn to park (its clocks end it far sooner)
MARGIN_S = 1.0  # seconds of slack on every time bound


def parked(store, conversation_id: str) -> dict:
    """The state once the turn waits for an approval."""
    return wait_for(lambda: (s := store.read(conversation_id)) is not None and (
        s["status"] == Status.AWAITING_APPROVAL or s["done"]) and s, PARK_WITHIN_S, "the turn to park")


def tool_results(state: dict) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in state["history"] if m["role"] == "tool"}


def approval_steps(state: dict) -> list[dict]:
    return [s for s in state["steps"] if s["kind"] == "approval" and s["turn_id"] == state["turn_id"]]


def test_a_tool_that_asks_first_parks_the_turn_and_frees_its_worker(pool, store, queue):
    conversation_id = ask(store, queue, "what is 6*7?", ASKS)
    state = parked(store, conversation_id)
    assert state["status"] == Status.AWAITING_APPROVAL and state["done"] is False
    request = state["approval"]
    assert request["name"] == "calculator" and "6*7" in request["arguments"] and request["answer"] is None
    assert request["expires_at"] == pytest.approx(request["asked_at"] + ASKS.approval_timeout_s)
    # Its job returned: no worker holds the turn while a person reads.
    wait_for(lambda: job_status(queue.connection, state["job_id"]) == "finished", 5, "the parking job to finish")
    assert store.flags.parked() >= 1
    # The call has no result yet: it runs after the answer.
    call_id = request["call_id"]
    assert call_id not in tool_results(state)

    answered = approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE)
    assert answered.taken, answered.message
    again = approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE)
    assert again.outcome == "answered" and "already answered: approved on the page" in again.message

    final = wait_done(store, conversation_id)
    assert final["status"] == Status.DONE, final["error"]
    assert tool_results(final).get(call_id) == "42", json.dumps(final, indent=1)[-6000:]
    [step] = approval_steps(final)
    assert step["outcome"] == Outcome.APPROVED and step["answered_by"] == BY_PAGE
    assert step["started_at"] == pytest.approx(request["asked_at"])
    # A fresh set of clocks for the continuation: its deadline is after the answer, the first job's before.
    assert step["deadline_at"] == state["deadline_at"]
    assert final["deadline_at"] > step["ended_at"] > step["started_at"] > state["started_at"]
    assert final["started_at"] >= step["ended_at"]
    assert final["approval"]["answer"] == Outcome.APPROVED
    tool = [s for s in final["steps"] if s["kind"] == "tool" and s["turn_id"] == final["turn_id"]]
    assert [s["call_id"] for s in tool] == [call_id]


def test_a_declined_call_tells_the_model_and_the_turn_answers(pool, store, queue):
    conversation_id = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, conversation_id)["approval"]
    assert approvals.answer(store, queue, conversation_id, Outcome.DENIED, BY_CLI).taken
    after = approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE)
    assert after.outcome == "answered" and "declined from the command line" in after.message
    final = wait_done(store, conversation_id)
    assert final["status"] == Status.DONE
    assert tool_results(final)[request["call_id"]] == DENIED_RESULT
    assert [s["outcome"] for s in approval_steps(final)] == [Outcome.DENIED]
    assert not [s for s in final["steps"] if s["kind"] == "tool" and s["turn_id"] == final["turn_id"]]


def test_a_request_nobody_answers_expires_on_its_own_and_is_not_a_decline(pool, store, queue):
    config = ASKS.with_changes(approval_timeout_s=2.0)
    conversation_id = ask(store, queue, "what is 6*7?", config)
    request = parked(store, conversation_id)["approval"]
    final = wait_done(store, conversation_id, timeout_s=config.approval_timeout_s + 15)
    [step] = approval_steps(final)
    assert step["outcome"] == Outcome.EXPIRED and step["answered_by"] == approvals.BY_NOBODY
    # The pool's watch expired it within 2 s of its time (no page open).
    assert request["expires_at"] - MARGIN_S <= step["ended_at"] <= request["expires_at"] + 2 + MARGIN_S
    result = tool_results(final)[request["call_id"]]
    assert "expired" in result and "declined" not in result.replace("Nobody declined", "")
    assert final["status"] == Status.DONE
    late = approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE)
    assert late.outcome == "answered" and "expired (nobody answered in time)" in late.message


def test_calls_that_need_no_approval_run_first_and_every_call_gets_one_result(pool, store, queue, scripted):
    calls = [tool_call("current_time", {"timezone": "UTC"}, "call_a"), tool_call("calculator", {"expression": "1+1"},
                                                                                "call_b"),
             tool_call("calculator", {"expression": "2+2"}, "call_c")]
    scripted.add(chat_reply(None, calls), chat_reply("all done"))
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                               approve_tools=("current_time",))
    conversation_id = ask(store, queue, "three tools", config)
    state = parked(store, conversation_id)
    assert state["approval"]["call_id"] == "call_a"
    assert tool_results(state) == {"call_b": "2", "call_c": "4"}
    assert approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE).taken
    final = wait_done(store, conversation_id)
    results = [m["tool_call_id"] for m in final["history"] if m["role"] == "tool"]
    assert sorted(results) == ["call_a", "call_b", "call_c"]  # each exactly once
    assert final["history"][-1]["content"] == "all done"


def test_stop_and_delete_end_a_parked_turn(pool, store, queue):
    from agent.ui.state import stop

    conversation_id = ask(store, queue, "what is 6*7?", ASKS)
    state = parked(store, conversation_id)
    stop(store, {}, state, 600, queue.connection)
    final = store.read(conversation_id)
    assert final["done"] and final["status"] == Status.CANCELLED
    assert "waited for your approval" in final["history"][-1]["content"]
    assert approvals.answer(store, queue, conversation_id, Outcome.APPROVED, BY_PAGE).outcome == "none"

    other = ask(store, queue, "what is 6*7?", ASKS)
    parked(store, other)
    assert store.delete(other)
    assert other not in store.flags.approvals_due(time.time() + 10 * ASKS.approval_timeout_s, 10_000)
    assert approvals.answer(store, queue, other, Outcome.APPROVED, BY_PAGE).outcome == "gone"


def test_parked_turns_leave_the_workers_to_other_conversations(pool, store, queue):
    waiting = [ask(store, queue, "what is 6*7?", ASKS) for _ in range(6)]
    for conversation_id in waiting:
        parked(store, conversation_id)
    started = time.monotonic()
    other = ask(store, queue, "what is 2+3?", FAST)
    final = wait_done(store, other)
    assert final["status"] == Status.DONE and time.monotonic() - started < FAST.job_timeout_s
    assert all(store.read(c)["status"] == Status.AWAITING_APPROVAL for c in waiting)
    for conversation_id in waiting:
        approvals.answer(store, queue, conversation_id, Outcome.DENIED, BY_PAGE)


def test_the_command_line_answers_once_and_says_when_there_is_nothing_to_answer(pool, store, queue, redis_url,
                                                                               base_env):
    conversation_id = ask(store, queue, "what is 6*7?", ASKS)
    parked(store, conversation_id)
    env = {**base_env, "REDIS_URL": redis_url}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)

    listed = [line for line in cli("list", "--limit", "1000").stdout.splitlines() if conversation_id in line]
    assert listed and "[awaiting approval]" in listed[0], listed
    shown = cli("show", conversation_id)
    request_id = store.read(conversation_id)["approval"]["id"]
    assert shown.returncode == 0 and f"[approval needed] request {request_id}: calculator with" in shown.stdout
    assert f"python -m agent approve {conversation_id} --request {request_id}" in shown.stdout
    bare = cli("approve", conversation_id)  # no terminal to show the request on, and no request named
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1 and "--request" in bare.stderr
    first = cli("approve", conversation_id, "--request", request_id)
    assert first.returncode == 0, first.stderr
    second = cli("deny", conversation_id, "--request", request_id)
    assert second.returncode == 2 and second.stderr.count("\n") == 1
    assert "already answered: approved from the command line" in second.stderr
    final = wait_done(store, conversation_id)
    assert final["status"] == Status.DONE
    none = cli("approve", "no-such-conversation", "--request", request_id)
    assert none.returncode == 2 and none.stderr.count("\n") == 1


def test_with_safeguards_off_the_job_waits_holding_its_worker_until_the_queue_kills_it(pool, store, queue):
    config = ASKS.with_changes(safeguards=False)
    conversation_id = ask(store, queue, "what is 6*7?", config)
    state = parked(store, conversation_id)
    assert state["status"] == Status.AWAITING_APPROVAL
    assert job_status(queue.connection, state["job_id"]) == "started"  # the worker waits with it
    final = wait_done(store, conversation_id, timeout_s=config.job_timeout_s + 15)
    assert final["status"] == Status.TIMED_OUT and final["error"]["kind"] == "job_timeout"



# -- across processes: the command line, a restart of everything, a worker killed after Approve ----------


def asking_cli(env: dict, message: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`ask` with the app's own services, followed until it tells the request on stderr: (the process, the
    conversation id, the stderr lines so far; request_told gives the request's id)."""
    proc = subprocess.Popen([sys.executable, "-m", "agent", "ask", message], env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    while not any(line.startswith("[approval needed]") for line in lines):
        line = proc.stderr.readline()
        assert line, f"ask ended before asking: {lines} {proc.poll()}"
        lines.append(line)
    lines.append(proc.stderr.readline())  # how to answer it
    return proc, lines[0].split("conversation ", 1)[1].split(",", 1)[0], lines


def request_told(lines: list[str]) -> str:
    """The id of the request `ask` told on stderr."""
    return re.search(r"^\[approval needed\] request ([0-9a-f]+):", "".join(lines), re.M)[1]


def test_ask_shows_the_request_says_how_to_answer_and_follows_to_the_end(base_env):
    env = {**base_env, "AGENT_WORKERS": "1", "AGENT_APPROVE_TOOLS": "calculator"}
    proc, cid, lines = asking_cli(env, "What is 6*7?")
    try:
        told, request_id = "".join(lines), request_told(lines)
        assert "calculator" in told and "6*7" in told
        assert f"python -m agent approve {cid} --request {request_id}" in told
        assert f"python -m agent deny {cid} --request {request_id}" in told
        approved = subprocess.run([sys.executable, "-m", "agent", "approve", cid, "--request", request_id], env=env,
                                  cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)
        assert approved.returncode == 0, approved.stderr
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "42" in out and "approved from the command line" in err
    finally:
        stop_cli(proc)


def stop_cli(proc: subprocess.Popen) -> None:
    """Stop an `ask` like Ctrl-C (it stops the Redis and workers it started), or kill its whole group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_a_parked_turn_survives_a_restart_of_everything_and_can_still_be_answered(base_env):
    env = {**base_env, "AGENT_WORKERS": "1", "AGENT_APPROVE_TOOLS": "calculator"}
    proc, cid, lines = asking_cli(env, "What is 6*7?")
    tree = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
    embedded = EmbeddedRedis(Path(env["AGENT_DATA_DIR"]))
    server = embedded.pid
    # With `appendfsync everysec` Redis may answer before it writes to its append-only file (it postpones
    # the write up to 2 s while the last fsync is still running, as on a busy disk): what a SIGKILL keeps
    # is what was written. So the kill comes once the request is in the file, as after any real wait.
    aof = redis.Redis.from_url(embedded.url)
    try:
        wait_for(lambda: aof.info("persistence")["aof_buffer_length"] == 0, 10, "the append-only file written")
    finally:
        aof.close()
    try:
        for pid in [proc.pid, *tree, server]:  # every process, Redis included, without a word
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        stop_cli(proc)
    # Redis starts again from its append-only file: the request is still there, and can be answered.
    approved = subprocess.run([sys.executable, "-m", "agent", "approve", cid, "--request", request_told(lines)],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert approved.returncode == 0, approved.stderr
    # Any pool serves the continuation: this `ask` starts one, which takes it first (it is at the front).
    other = subprocess.run([sys.executable, "-m", "agent", "ask", "hello"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=90)
    assert other.returncode == 0, other.stderr
    shown = subprocess.run([sys.executable, "-m", "agent", "show", cid, "--json"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=90)
    final = json.loads(shown.stdout)
    assert final["done"] and final["status"] == Status.DONE, final["status"]
    assert "42" in tool_results(final).values()


def test_a_worker_killed_right_after_approve_has_the_turn_resumed(private_redis, workers):  # noqa: F811
    workers(2)
    store, queue = private_redis.store, private_redis.queue
    config = SLOW_CALL.with_changes(approve_tools=("calculator",))
    cid = ask(store, queue, "what is 6*7?", config)
    wait_for(lambda: (s := store.read(cid)) and s["status"] == Status.AWAITING_APPROVAL, 30, "the turn to park")
    assert approvals.answer(store, queue, cid, Outcome.APPROVED, BY_PAGE).taken
    # The continuation runs the approved tool, then calls the model (3 s): its worker is killed in that call.
    pid, job_id = wait_for(lambda: worker_running(private_redis.queue_connection, cid), 30, "the continuation runs")
    assert "-approval-" in job_id
    wait_for(lambda: tool_results(store.read(cid)), 10, "the approved tool's result")
    os.kill(pid, signal.SIGKILL)
    final = wait_done(store, cid, timeout_s=60)
    assert final["status"] == Status.DONE, final["error"]
    assert [s["kind"] for s in final["steps"] if s["kind"] in ("approval", "resume")] == ["approval", "resume"]
    assert final["attempt"] == 1 and "42" in final["history"][-1]["content"]
    assert_every_call_answered_once(final["history"])


# -- what a reader makes of it: the trace, the export, a hostile request --------------------------------


def test_the_trace_and_the_export_say_expired_not_declined(pool, store, queue):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent import tracing
    from agent.conversation import export

    config = ASKS.with_changes(approval_timeout_s=1.0)
    conversation_id = ask(store, queue, "what is 6*7?", config)
    final = wait_done(store, conversation_id, timeout_s=20)
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        tracing.export_turn(tracing._tracer, final, final["turn_id"])
    finally:
        tracing.use_provider(None)
        provider.shutdown()
    [span] = [s for s in exporter.get_finished_spans() if s.name == "await_approval calculator"]
    assert span.attributes["agent.approval.answer"] == "expired"
    [turn] = [s for s in exporter.get_finished_spans() if s.name == tracing.TURN_SPAN]
    assert "approval_expired" in [event.name for event in turn.events]
    markdown = export.to_markdown(final)
    assert "*Approval of `calculator`: expired (nobody answered within" in markdown
    # "declined" only ever denied: "(not declined)", "Nobody declined it".
    assert set(re.findall(r"(\w+) declined", markdown)) <= {"not", "Nobody"}, markdown


@pytest.mark.parametrize("stored", [None, "text", 5, [], {}, {"id": "x"}, {"id": 5, "name": ["a"], "expires_at": "x"},
                                    {"id": "x", "name": "calculator", "expires_at": "soon"},
                                    {"id": "x", "name": "t", "expires_at": 1.0, "arguments": {"a": 1}, "answer": 3}])
def test_a_stored_request_of_the_wrong_shape_reads_as_none_or_with_each_field_of_its_type(stored):
    from agent.conversation.well_formed import approval

    read = approval(stored)
    if read is not None:
        assert all(isinstance(read[k], str) for k in ("id", "call_id", "name", "arguments"))
        assert isinstance(read["expires_at"], float | int) and read["answer"] in (None, "3")
    else:
        assert not (isinstance(stored, dict) and stored.get("name") == "t")


def test_the_list_marks_a_parked_conversation_as_waiting_for_a_person():
    from agent.conversation.listing import ConversationInfo, _row
    from agent.ui.conversations import AWAITING_MARK, IN_FLIGHT_MARK, row_label

    parked_row = _row("c1", b"note it", 1.0, b"1", b"0", b"a1b2")
    running_row = _row("c2", b"sum", 1.0, b"1", b"0", None)
    ended_row = _row("c3", b"done", 1.0, b"1", b"1", b"stale")  # an ended turn waits for nobody
    assert parked_row.awaiting_approval and parked_row.in_flight
    assert not running_row.awaiting_approval and not ended_row.awaiting_approval and not ended_row.in_flight
    assert row_label(parked_row).startswith(AWAITING_MARK) and row_label(running_row).startswith(IN_FLIGHT_MARK)
    assert isinstance(parked_row, ConversationInfo)
