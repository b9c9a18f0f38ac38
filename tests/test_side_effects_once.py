"""A side effect never runs twice, wherever its worker is lost: the kill swept across every call of a
16-call reply (and of the second of two replies), with SIGKILL and with SIGSTOP past the heartbeat then
SIGCONT, before and after the side effect, on simple and forking workers.

The tool (tests/ledger_tools.py) is not safe to repeat and needs no approval: it appends a line to a
ledger, keyed by its idempotency key, and kills or freezes its own process at the call the test's script
names. Real Redis (this test's own), a real pool, and a scripted OpenAI-compatible model on loopback.
What must hold for every turn: it ends `done`, after one resume; every tool call has exactly one result;
the ledger never has an entry twice; every call that finished keeps its real result, and the one the
loss cut gets the result saying it was not run again.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from dataclasses import dataclass

import pytest

from agent.queue import new_id, submit_turn
from agent.turn.tool_runs import LOST_TOOL_RESULT, idempotency_key
from harness import pools
from harness.processes import kill
from tests.conftest import CANARY_KEY, FAST
from tests.scripted_server import ScriptedServer, chat_reply, respond, tool_call
from tests.test_resume import assert_every_call_answered_once, turn_messages

CALLS = 16  # tool calls in each reply
WORKERS = 8  # a pool's workers: the turns of a sweep run side by side
SWEEP_S = 300.0  # seconds the whole sweep of one worker class may take (each turn's clocks end it sooner)
POLL_S = 0.1
# Clocks long enough that a turn lost at its last call still resumes, with a queue of other turns ahead.
CLOCKS = dict(job_timeout_s=60, deadline_margin_s=4.0, call_timeout_cap_s=15.0, min_call_s=0.5,
              tool_timeout_cap_s=15.0, max_steps=4)


@dataclass(frozen=True)
class Scenario:
    replies: int  # 1 or 2: the loss comes in the last one
    crash: str  # what the tool does at call `at` of the last reply (tests/ledger_tools.py)
    at: int  # 0 .. CALLS - 1

    @property
    def message(self) -> str:
        return json.dumps({"replies": self.replies, "crash": self.crash, "at": self.at})


def sweep() -> list[Scenario]:
    """Every call index, with both signals, before and after the side effect (alternating by index),
    in a one-reply and a two-reply turn."""
    return [Scenario(replies, f"{how}-{'after' if at % 2 == 0 else 'before'}", at)
            for replies in (1, 2) for how in ("kill", "stop") for at in range(CALLS)]


def entry(tag: str, reply: int, index: int) -> str:
    return f"{tag}-r{reply}-c{index}"


def call_id(reply: int, index: int) -> str:
    return f"call_r{reply}_{index}"


def model_reply(request) -> object:
    """The script: the user's message names the scenario; each reply asks for CALLS ledger calls until
    the scenario's replies are out, then the answer. Decided from the history alone, so a resumed turn's
    calls get the same replies."""
    messages = request.json["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    message = messages[last_user]["content"]
    scenario = Scenario(**json.loads(message))
    done = sum(1 for m in messages[last_user:] if m["role"] == "assistant")
    if done >= scenario.replies:
        return chat_reply(f"wrote {scenario.replies * CALLS} entries")
    reply = done + 1
    calls = [tool_call("ledger", {"entry": entry(_tag(message), reply, i),
                                  "crash": scenario.crash if (reply == scenario.replies and i == scenario.at) else ""},
                       call_id=call_id(reply, i))
             for i in range(CALLS)]
    return chat_reply(None, calls)


def _tag(message: str) -> str:
    scenario = Scenario(**json.loads(message))
    return f"{scenario.replies}{scenario.crash}{scenario.at}"


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_side_effect_never_runs_twice_wherever_its_worker_is_lost(private_redis, tmp_path, worker_class):
    ledger = tmp_path / "ledger.txt"
    stopped_file = tmp_path / "ledger.txt.stopped"
    model = ScriptedServer(default=respond(model_reply))
    env = {"AGENT_TOOLS": "tests.ledger_tools", "LEDGER_FILE": str(ledger), "OPENAI_API_KEY": CANARY_KEY}
    handle = pools.start_pool(private_redis.url, WORKERS, tmp_path / "pool.log", worker_class=worker_class, env=env,
                              demo=False, queue_connection=private_redis.queue_connection)
    woken: set[tuple[int, str]] = set()
    try:
        config = FAST.with_changes(provider="openai", model="scripted", base_url=model.url + "/v1", **CLOCKS)
        turns = {}
        for scenario in sweep():
            cid = new_id()
            submit_turn(private_redis.store, private_redis.queue, cid, scenario.message, config)
            turns[cid] = scenario
        finals = follow(private_redis.store, turns, stopped_file, woken)
    finally:
        kill(sorted(stopped_pids(stopped_file)), signal.SIGCONT)
        pools.stop_pool(handle, private_redis.url)
        model.stop()

    lines = [line.split() for line in ledger.read_text().splitlines()]
    entries = [fields[1] for fields in lines]
    twice = sorted({e for e in entries if entries.count(e) > 1})
    assert not twice, f"{len(twice)} side effects ran twice: {twice[:10]}"
    for cid, scenario in turns.items():
        check_turn(finals[cid], scenario, set(entries))
    # The key a tool was given is its turn's and its call's, the same on the worker that was lost.
    keys = {fields[1]: fields[0] for fields in lines}
    for cid, scenario in turns.items():
        final = finals[cid]
        for reply in range(1, scenario.replies + 1):
            for index in range(CALLS):
                name = entry(_tag(scenario.message), reply, index)
                if name in keys:
                    assert keys[name] == idempotency_key(final["turn_id"], call_id(reply, index)), name


def follow(store, turns: dict, stopped_file, woken: set[tuple[int, str]]) -> dict:
    """Every turn's final state; a frozen worker is woken (SIGCONT) once its turn was resumed elsewhere."""
    end = time.monotonic() + SWEEP_S
    finals: dict[str, dict] = {}
    turn_of: dict[str, str] = {}  # turn id -> conversation id
    states: dict[str, dict | None] = {}
    while len(finals) < len(turns):
        if time.monotonic() > end:
            left = collections.Counter((turns[cid].crash, s and s["status"], s and s["attempt"])
                                       for cid, s in states.items())
            raise AssertionError(f"{len(turns) - len(finals)} turns did not end within {SWEEP_S} s: {left}")
        states = {cid: store.read(cid) for cid in turns if cid not in finals}
        for cid, state in states.items():
            if state is None:
                continue
            turn_of[state["turn_id"]] = cid
            if state["done"]:
                finals[cid] = state
        for pid, turn_id in stopped_by_turn(stopped_file):  # a simple worker may be frozen by several turns
            cid = turn_of.get(turn_id)
            state = states.get(cid) or finals.get(cid)
            if (pid, turn_id) not in woken and state is not None and state["attempt"] >= 1:
                os.kill(pid, signal.SIGCONT)
                woken.add((pid, turn_id))
        time.sleep(POLL_S)
    return finals


def stopped_by_turn(stopped_file) -> list[tuple[int, str]]:
    if not stopped_file.exists():
        return []
    found = []
    for line in stopped_file.read_text().splitlines():
        pid, key = line.split()
        found.append((int(pid), key.split(":")[0]))
    return found


def stopped_pids(stopped_file) -> set[int]:
    return {pid for pid, _ in stopped_by_turn(stopped_file)}


def check_turn(final: dict, scenario: Scenario, written: set[str]) -> None:
    what = f"{scenario}: "
    assert final["status"] == "done" and final["error"] is None, what + f"{final['status']} {final['error']}"
    resumes = [s for s in final["steps"] if s["kind"] == "resume" and s["turn_id"] == final["turn_id"]]
    assert [s["attempt"] for s in resumes] == [1], what + f"resumes {resumes}"
    history = turn_messages(final)
    assert_every_call_answered_once(history)
    results = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    tag = _tag(scenario.message)
    for reply in range(1, scenario.replies + 1):
        for index in range(CALLS):
            name, cut = entry(tag, reply, index), reply == scenario.replies and index == scenario.at
            result = results[call_id(reply, index)]
            if cut:
                assert result == LOST_TOOL_RESULT, what + f"the cut call's result: {result}"
                # Killed before its side effect, it never happened; frozen before it, it happens on waking.
                assert (name in written) == (scenario.crash != "kill-before"), what + name
            else:
                assert result == f"written: {name}", what + f"call {reply}/{index}: {result}"
                assert name in written, what + f"{name} never written"
    assert history[-1]["content"] == f"wrote {scenario.replies * CALLS} entries", what + str(history[-1])
