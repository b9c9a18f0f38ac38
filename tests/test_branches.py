"""Regenerate, edit and switch on a real Redis with real workers: the model is sent the path from the first turn
to the new turn's parent, then the turn, and never a message of another branch; the CLI's `regenerate`, `edit`,
`branches` and `switch`; approvals, Stop and a lost worker on a branch turn as on any turn."""

from __future__ import annotations

import json

import pytest

from agent.contract import Role
from agent.conversation.errors import NoSuchTurn, TurnInFlight
from agent.queue import new_id, submit_turn
from tests.conftest import FAST, wait_done
from tests.scripted_server import chat_reply
from tests.test_cli import cli, cli_env, one_line  # noqa: F401 - cli_env is a fixture
from tests.test_resume import workers  # noqa: F401 - a fixture

TURN_TIMEOUT_S = 30


def scripted_config(server, **changes):
    return FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1", **changes)


def sent(request) -> list[str]:
    """The contents of the messages a model request carried (the system prompt left out)."""
    return [m.get("content") for m in request.json["messages"] if m.get("role") != Role.SYSTEM]


def test_the_model_is_sent_the_path_to_the_new_turn_and_never_another_branch(store, queue, pool, scripted):
    config = scripted_config(scripted)
    cid = new_id()
    scripted.add(chat_reply("one"), chat_reply("two-a"), chat_reply("two-b"), chat_reply("edited-one"),
                 chat_reply("three"))

    def turn(text, branch_of=""):
        turn_id = submit_turn(store, queue, cid, text, config, branch_of=branch_of)
        state = wait_done(store, cid, TURN_TIMEOUT_S)
        assert state["status"] == "done", state
        return turn_id, state

    first, _ = turn("first")
    second, _ = turn("second")
    regenerated, state = turn("second", branch_of=second)
    assert sent(scripted.requests[2]) == ["first", "one", "second"]  # not "two-a"
    assert [m["content"] for m in state["history"]] == ["first", "one", "second", "two-b"]
    assert state["siblings"] == [second, regenerated] and state["parent_turn_id"] == first

    edited, state = turn("first, edited", branch_of=first)
    assert sent(scripted.requests[3]) == ["first, edited"]
    assert [m["content"] for m in state["history"]] == ["first, edited", "edited-one"]
    assert state["siblings"] == [first, edited]

    assert store.switch(cid, second) == second  # the first answer to "second", on its branch
    third, state = turn("third")
    assert sent(scripted.requests[4]) == ["first", "one", "second", "two-a", "third"]
    assert [t["turn_id"] for t in state["turns"]] == [first, second, third]
    assert [t["siblings"] for t in state["turns"]] == [[first, edited], [second, regenerated], [third]]
    assert store.read(cid)["parent_turn_id"] == second


def test_a_regenerate_or_an_edit_while_a_turn_is_in_flight_is_refused_with_a_sentence(store, queue, pool, scripted):
    from agent.runtime.loopback_server import delayed

    config = scripted_config(scripted)
    cid = new_id()
    scripted.add(chat_reply("one"), delayed(2.0, chat_reply("slow")))
    first = submit_turn(store, queue, cid, "first", config)
    wait_done(store, cid, TURN_TIMEOUT_S)
    submit_turn(store, queue, cid, "second", config)
    for text, branch_of in (("first", first), ("other", first)):
        with pytest.raises(TurnInFlight) as info:
            submit_turn(store, queue, cid, text, config, branch_of=branch_of)
        assert "Stop it first" in str(info.value)
    with pytest.raises(TurnInFlight):
        store.switch(cid, first)
    state = wait_done(store, cid, TURN_TIMEOUT_S)
    assert [m["content"] for m in state["history"]] == ["first", "one", "second", "slow"]
    with pytest.raises(NoSuchTurn):
        submit_turn(store, queue, cid, "x", config, branch_of="no-such-turn")


def test_regenerate_edit_branches_and_switch_from_the_cli(cli_env):  # noqa: F811
    asked = cli(cli_env, "ask", "--json", "What is 2+3?")
    assert asked.returncode == 0, asked.stderr
    first = json.loads(asked.stdout.decode().splitlines()[-1])
    cid, first_turn = first["conversation_id"], first["turn_id"]
    second = cli(cli_env, "ask", "--conversation", cid, "--json", "What is 4*5?")
    assert second.returncode == 0, second.stderr
    second_turn = json.loads(second.stdout.decode().splitlines()[-1])["turn_id"]

    regenerated = cli(cli_env, "regenerate", cid, "--json")  # the last turn shown, by default
    assert regenerated.returncode == 0, regenerated.stderr
    lines = [json.loads(line) for line in regenerated.stdout.decode().splitlines()]
    final = lines[-1]
    assert final["delta"] is False and final["done"] and final["status"] == "done"
    assert final["turn_id"] != second_turn and final["siblings"] == [second_turn, final["turn_id"]]
    assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["What is 2+3?", "What is 4*5?"]
    assert "20" in final["history"][-1]["content"]

    edited = cli(cli_env, "edit", cid, first_turn, "What is 6*7?")  # text, as `ask` prints it
    assert edited.returncode == 0, edited.stderr
    assert "42" in edited.stdout.decode()
    shown = json.loads(cli(cli_env, "show", cid, "--json").stdout)
    assert [m["content"] for m in shown["history"] if m["role"] == "user"] == ["What is 6*7?"]
    tree = shown["branches"]
    assert [t["depth"] for t in tree["turns"]] == [0, 1, 1, 0]
    assert [t["shown"] for t in tree["turns"]] == [False, False, False, True]
    assert tree["turns"][0]["first_words"] == "What is 2+3?" and tree["turns"][3]["first_words"] == "What is 6*7?"
    assert json.loads(cli(cli_env, "branches", cid, "--json").stdout) == tree

    switched = cli(cli_env, "switch", cid, first_turn)
    assert switched.returncode == 0, switched.stderr
    state = json.loads(cli(cli_env, "show", cid, "--json").stdout)
    assert state["turn_id"] == final["turn_id"]  # down the branch to its latest turn
    drawn = cli(cli_env, "branches", cid).stdout.decode()
    assert f"* {first_turn} (1 / 2)" in drawn and f"*   {final['turn_id']} (2 / 2)" in drawn
    text = cli(cli_env, "show", cid).stdout.decode()
    assert "What is 2+3?" in text and "What is 6*7?" not in text and "branch 2 of 2" in text

    markdown = cli(cli_env, "export", cid).stdout.decode()  # the branch shown, and its forks
    assert "What is 2+3?" in markdown and "What is 6*7?" not in markdown
    assert "this is branch 1 of 2; 1 other branch here" in markdown  # the first turn: edited once
    assert "this is branch 2 of 2; 1 other branch here" in markdown  # the regenerated answer
    every = cli(cli_env, "export", cid, "--all-branches").stdout.decode()
    assert every.count("## Branch ") == 3 and "What is 6*7?" in every and every.count("What is 4*5?") == 2
    whole = json.loads(cli(cli_env, "export", cid, "--format", "json").stdout)
    assert [t["turn_id"] for t in whole["tree"]] == [t["turn_id"] for t in tree["turns"]]
    assert [t["messages"][0]["content"] for t in whole["tree"]] == [
        "What is 2+3?", "What is 4*5?", "What is 4*5?", "What is 6*7?"]
    assert all(t["summary"]["status"] == "done" for t in whole["tree"])

    refused = cli(cli_env, "edit", cid, "no-such-turn", "hello")
    assert refused.returncode == 2 and "no turn" in one_line(refused.stderr)
    refused = cli(cli_env, "switch", cid, "no-such-turn")
    assert refused.returncode == 2 and "no turn" in one_line(refused.stderr)
    refused = cli(cli_env, "regenerate", cid, "--turn", "no-such-turn")
    assert refused.returncode == 2 and "no turn" in one_line(refused.stderr)


def test_a_regenerate_that_parks_for_approval_goes_on_on_its_own_branch(store, queue, pool):
    from agent.contract import Outcome, Status
    from agent.turn import approvals
    from tests.test_approvals import ASKS, parked, tool_results

    cid = new_id()
    first = submit_turn(store, queue, cid, "what is 6*7?", FAST)
    answered = wait_done(store, cid, TURN_TIMEOUT_S)
    regenerated = submit_turn(store, queue, cid, "what is 6*7?", ASKS, branch_of=first)
    state = parked(store, cid)
    assert state["status"] == Status.AWAITING_APPROVAL and state["turn_id"] == regenerated
    assert [m["role"] for m in state["history"]][:1] == ["user"] and state["history"].count(state["history"][0]) == 1
    with pytest.raises(TurnInFlight):  # parked is in flight: Stop it first
        store.switch(cid, first)
    assert approvals.answer(store, queue, cid, Outcome.APPROVED, "on the page").taken
    final = wait_done(store, cid, TURN_TIMEOUT_S)
    assert final["status"] == Status.DONE and tool_results(final).get(final["approval"]["call_id"]) == "42"
    assert final["siblings"] == [first, regenerated]
    assert [m for m in final["history"] if m["role"] == "user"] == [{"role": "user", "content": "what is 6*7?"}]
    store.switch(cid, first)
    assert store.read(cid)["history"] == answered["history"]  # the first answer is kept as it was


def test_a_parked_regenerate_and_edit_answered_from_the_cli_go_on_on_their_own_branch(store, queue, pool,
                                                                                     base_env, redis_url):
    import subprocess
    import sys

    from agent.contract import Status
    from tests.conftest import ROOT
    from tests.test_approvals import ASKS, parked, tool_results

    def cli_answer(command, cid, request_id):
        done = subprocess.run([sys.executable, "-m", "agent", command, cid, "--request", request_id], cwd=ROOT,
                              env={**base_env, "REDIS_URL": redis_url}, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr

    cid = new_id()
    first = submit_turn(store, queue, cid, "hello", FAST)
    wait_done(store, cid, TURN_TIMEOUT_S)
    second = submit_turn(store, queue, cid, "what is 6*7?", FAST)
    answered = wait_done(store, cid, TURN_TIMEOUT_S)
    regenerated = submit_turn(store, queue, cid, "what is 6*7?", ASKS, branch_of=second)
    state = parked(store, cid)
    assert state["status"] == Status.AWAITING_APPROVAL and state["turn_id"] == regenerated
    cli_answer("approve", cid, state["approval"]["id"])
    final = wait_done(store, cid, TURN_TIMEOUT_S)
    assert final["status"] == Status.DONE and tool_results(final).get(final["approval"]["call_id"]) == "42"
    assert final["turn_id"] == regenerated and final["siblings"] == [second, regenerated]
    assert final["parent_turn_id"] == first
    assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["hello", "what is 6*7?"]

    edited = submit_turn(store, queue, cid, "what is 5*5?", ASKS, branch_of=second)  # an edit, parked: denied
    state = parked(store, cid)
    assert state["turn_id"] == edited and state["siblings"] == [second, regenerated, edited]
    cli_answer("deny", cid, state["approval"]["id"])
    final = wait_done(store, cid, TURN_TIMEOUT_S)
    assert final["turn_id"] == edited and final["parent_turn_id"] == first
    assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["hello", "what is 5*5?"]
    assert "42" not in [m["content"] for m in final["history"] if m["role"] == "tool"]
    assert store.switch(cid, second) == second and store.read(cid)["history"] == answered["history"]
    assert store.switch(cid, regenerated) == regenerated
    assert tool_results(store.read(cid)).get(store.read(cid)["approval"]["call_id"]) == "42"


def test_stop_ends_a_branch_turn_and_leaves_the_other_branch(store, queue, pool):
    from agent.ui.state import stop
    from harness.waiting import wait_for
    from tests.test_resume import SLOW_CALL

    cid = new_id()
    first = submit_turn(store, queue, cid, "hello", FAST)
    answered = wait_done(store, cid, TURN_TIMEOUT_S)
    regenerated = submit_turn(store, queue, cid, "hello", SLOW_CALL, branch_of=first)
    state = wait_for(lambda: (s := store.read(cid)) and s["status"] == "running" and s, 20, "the branch turn runs")
    stop(store, {}, state, 600, queue.connection)
    final = wait_done(store, cid, TURN_TIMEOUT_S)
    assert final["status"] == "cancelled" and final["turn_id"] == regenerated
    assert final["siblings"] == [first, regenerated]
    assert store.switch(cid, first) == first and store.read(cid)["history"] == answered["history"]


def test_a_branch_turn_whose_worker_is_lost_resumes_on_its_branch(private_redis, workers):  # noqa: F811
    import os
    import signal
    import time

    from harness.waiting import wait_for
    from tests.test_resume import SETTLE_S, SLOW_CALL, assert_resumed, read_when, running, running_jobs

    workers(2)
    store, queue = private_redis.store, private_redis.queue
    cid = new_id()
    first = submit_turn(store, queue, cid, "hello", FAST)
    wait_done(store, cid, TURN_TIMEOUT_S)
    second = submit_turn(store, queue, cid, "what is 2+2?", FAST)
    wait_done(store, cid, TURN_TIMEOUT_S)
    regenerated = submit_turn(store, queue, cid, "what is 2+2?", SLOW_CALL, branch_of=second)
    started = read_when(store, cid, running, 20, "the branch turn runs")
    # The worker running this turn's job (another may still name the turn before's as its job for a moment).
    pid = wait_for(lambda: next((pid for pid, job_id, _ in running_jobs(private_redis.queue_connection)
                                 if job_id == started["job_id"]), None), 20, "its worker")
    time.sleep(SETTLE_S)  # into its model call (3 s): not an assertion
    os.kill(pid, signal.SIGKILL)
    final = wait_done(store, cid, 45)
    assert_resumed(final, started, 1)
    assert final["turn_id"] == regenerated and final["siblings"] == [second, regenerated]
    assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["hello", "what is 2+2?"]
    assert final["parent_turn_id"] == first


def test_a_regenerate_and_an_edit_say_so_in_the_turn_and_its_trace(store, queue, pool):
    from agent import tracing
    from tests.test_nesting import _trace

    cid = new_id()
    first = submit_turn(store, queue, cid, "What is 2+2?", FAST)
    wait_done(store, cid, TURN_TIMEOUT_S)
    again = submit_turn(store, queue, cid, "What is 2+2?", FAST, branch_of=first)
    state = wait_done(store, cid, TURN_TIMEOUT_S)
    assert state["branch"] == {"of": first, "kind": "regenerate"}
    [span] = [s for s in _trace(state) if s.name == tracing.TURN_SPAN]
    assert span.attributes["agent.turn.branch"] == "regenerate" and span.attributes["agent.turn.branch_of"] == first
    assert "agent.turn.parent_id" not in span.attributes  # a first turn
    second = submit_turn(store, queue, cid, "And 3+3?", FAST)
    wait_done(store, cid, TURN_TIMEOUT_S)
    submit_turn(store, queue, cid, "And 4+4?", FAST, branch_of=second)
    state = wait_done(store, cid, TURN_TIMEOUT_S)
    assert state["branch"] == {"of": second, "kind": "edit"} and state["turns"][0]["branch"]["of"] == first
    [span] = [s for s in _trace(state) if s.name == tracing.TURN_SPAN]
    assert span.attributes["agent.turn.branch"] == "edit" and span.attributes["agent.turn.parent_id"] == again


def test_the_history_cap_cuts_the_oldest_end_of_the_path_sent(store, queue, pool, scripted):
    config = scripted_config(scripted, max_history_sent_bytes=350)
    cid = new_id()
    scripted.add(chat_reply("one"), chat_reply("two"), chat_reply("three-a"), chat_reply("three-b"))
    texts = ["A" * 100, "B" * 100, "C" * 100]
    turns = []
    for text in texts:
        turns.append(submit_turn(store, queue, cid, text, config))
        wait_done(store, cid, TURN_TIMEOUT_S)
    submit_turn(store, queue, cid, texts[2], config, branch_of=turns[2])
    state = wait_done(store, cid, TURN_TIMEOUT_S)
    assert sent(scripted.requests[2]) == texts[1:2] + ["two"] + texts[2:] == sent(scripted.requests[3])
    assert [s.get("turns_not_sent") for s in state["steps"] if s["turn_id"] == state["turn_id"]] == [1]
    assert [m["content"] for m in state["history"]] == [texts[0], "one", texts[1], "two", texts[2], "three-b"]
