"""Conversations as trees, driven at random against a plain model of the tree, with real Redis and real workers.

Seeded random sequences of send, edit, regenerate, switch, Stop, a worker SIGKILLed mid-call, and delete, on this
test's own Redis and pool, against a scripted OpenAI-compatible model that records every request and answers each
with a text of its own. After every operation: every request the model was sent is the model's path to the turn's
parent, then the turn's message (never a message of another branch), and the `history` read (whole, and only what is
new since the read before) is the model's shown path; before each delete and at the end, every export (Markdown of
the branch shown with its fork notes, every branch, the JSON tree) says what the model says.

Then the loss of a worker swept across a branch turn (tests/seams/sitecustomize.py): before its first write, just
after it, inside a tool, and at its final write, for a regenerate and an edit: each resumes on its own branch.

`BRANCH_PROPERTY_SEEDS=N` runs N seeds (and `BRANCH_PROPERTY_OPS=M` operations each) instead of the suite's few.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal

import pytest

from agent.conversation import export, tree
from agent.queue import new_id, submit_turn
from agent.runtime.loopback_server import delayed
from harness.waiting import wait_for
from tests.conftest import FAST, wait_done
from tests.scripted_server import chat_reply, respond
from tests.test_resume import running_jobs, workers  # noqa: F401 - workers is a fixture
from tests.tree_model import Model

SEEDS = int(os.environ.get("BRANCH_PROPERTY_SEEDS", "3"))
OPS = int(os.environ.get("BRANCH_PROPERTY_OPS", "15"))
SLOW_S = 1.5  # seconds a reply waits, for a Stop or a kill to land inside the call
TURN_S = 45.0
CLOCKS = dict(job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=10.0, min_call_s=0.5)
STOPPED = "Stopped at your request"


class Recorder:
    """The scripted model's answers: each request gets `R<n>` (n counts requests), after SLOW_S when `slow`."""

    def __init__(self, server):
        self.server, self.log, self.slow = server, [], False
        server.add(*[respond(self.answer)] * 2000)

    def answer(self, request):
        sent = [m.get("content") for m in request.json["messages"] if m.get("role") != "system"]
        text = f"R{len(self.log)}"
        self.log.append((sent, text))
        return delayed(SLOW_S, chat_reply(text)) if self.slow else chat_reply(text)


def check_sent(model, recorder, start, turn_id):
    """Every request since `start` carried the path to the turn's parent, then its message: nothing else."""
    expected = model.texts(model.path(model.parent[turn_id])) + [model.message[turn_id]]
    for sent, _ in recorder.log[start:]:
        assert sent == expected, (sent, expected)


def check_read(store, cid, model, known):
    path = model.path()
    fresh = store.read(cid)
    since = store.read_since(cid, known) if known is not None else fresh
    for state in (fresh, since):
        assert [m["content"] for m in state["history"]] == model.texts(path)
        assert [t["turn_id"] for t in state["turns"]] == path and state["turn_id"] == path[-1]
        assert [t["parent_turn_id"] for t in state["turns"]] == [model.parent[t] or None for t in path]
        assert [t["siblings"] for t in state["turns"]] == [model.kids[model.parent[t]] for t in path]
        assert state["siblings"] == model.kids[model.parent[path[-1]]]
        assert {s["turn_id"] for s in state["steps"]} <= set(path)
    return since


def check_exports(store, cid, model):
    """The exports as `python -m agent export` makes them (agent/cli/conversations.py): the branch shown, every
    branch, and the JSON tree."""
    state, shape = store.read(cid), store.branches(cid)
    markdown = export.to_markdown(state, None)
    notes = re.findall(r"\*A fork: this is branch (\d+) of (\d+);", markdown)
    forks = [(model.kids[model.parent[t]].index(t) + 1, len(model.kids[model.parent[t]])) for t in model.path()
             if len(model.kids[model.parent[t]]) > 1]
    assert [(int(a), int(b)) for a, b in notes] == forks
    assert markdown.count("## Turn ") == len(model.path())
    for turn in model.path():
        assert model.answer[turn] in markdown
    leaves = tree.leaves(shape)
    assert leaves == model.leaves()
    every = export.branches_to_markdown([state if tip == state["turn_id"] else store.read(cid, tip=tip)
                                         for tip in leaves], None)
    sections = re.split(r"^## Branch \d+ of \d+, through turn `([^`]*)`$", every, flags=re.M)[1:]
    assert [sections[i] for i in range(0, len(sections), 2)] == leaves
    for leaf, text in zip(leaves, sections[1::2], strict=True):
        assert text.count("### Turn ") == len(model.path(leaf))
        assert all(model.answer[t] in text for t in model.path(leaf))
    whole = json.loads(export.to_json(state, tree.whole(store.redis, cid, shape)))
    assert [t["turn_id"] for t in whole["tree"]] == model.depth_first()
    for turn in whole["tree"]:
        t = turn["turn_id"]
        assert turn["parent_turn_id"] == (model.parent[t] or None) and turn["siblings"] == model.kids[model.parent[t]]
        assert [m["content"] for m in turn["messages"]] == [model.message[t], model.answer[t]]
    assert [m["content"] for m in whole["history"]] == model.texts(model.path())


def kill_its_worker(private_redis, cid):
    state = wait_for(lambda: (s := private_redis.store.read(cid)) and s["status"] == "running" and s, 20, "running")
    pid = wait_for(lambda: next((p for p, job, _ in running_jobs(private_redis.queue_connection)
                                 if job == state["job_id"]), None), 20, "its worker")
    os.kill(pid, signal.SIGKILL)


def run_seed(seed, private_redis, scripted, recorder, seen):
    store, queue = private_redis.store, private_redis.queue
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1", **CLOCKS)
    rng = random.Random(seed)
    cid, model, known = new_id(), Model(), None
    for step in range(OPS):
        ops = ["send"] if not model.parent else [
            "send", "send", "regenerate", "regenerate", "edit", "edit", "switch", "switch", "stop", "kill"]
        op = "delete" if model.parent and rng.random() < 0.06 else rng.choice(ops)
        seen[op] = seen.get(op, 0) + 1
        if op == "switch":
            of = rng.choice(list(model.parent))
            assert store.switch(cid, of) == model.switch(of)
        elif op == "delete":
            check_exports(store, cid, model)
            assert store.delete(cid) and store.read(cid) is None
            cid, model, known = new_id(), Model(), None
            continue
        else:
            kind = op if op in ("send", "regenerate", "edit") else rng.choice(["send", "regenerate", "edit"])
            of = rng.choice(list(model.parent)) if kind != "send" and model.parent else ""
            text = model.message[of] if kind == "regenerate" else f"{kind} {seed}.{step}"
            parent = model.parent[of] if of else model.tip
            start = len(recorder.log)
            recorder.slow = op in ("stop", "kill")
            turn = submit_turn(store, queue, cid, text, config, branch_of=of)
            if op in ("stop", "kill"):
                wait_for(lambda start=start: len(recorder.log) > start, 20, "the turn's call")
                if op == "stop":
                    store.request_cancel(turn, 600)
                else:
                    kill_its_worker(private_redis, cid)
                recorder.slow = False
            final = wait_done(store, cid, TURN_S)
            assert final["turn_id"] == turn
            if op == "stop":
                assert final["status"] == "cancelled" and final["history"][-1]["content"].startswith(STOPPED)
                answer = final["history"][-1]["content"]
            else:
                assert final["status"] == "done", (op, final["status"], final["error"])
                answer = recorder.log[-1][1]
            if op == "kill":
                assert [s["attempt"] for s in final["steps"] if s["kind"] == "resume" and s["turn_id"] == turn] == [1]
            model.add(turn, parent, text, answer)
            check_sent(model, recorder, start, turn)
        known = check_read(store, cid, model, known)
    if model.parent:
        check_exports(store, cid, model)


def test_random_branch_operations_with_real_workers_agree_with_a_plain_model(private_redis, workers, scripted):  # noqa: F811
    workers(3)
    recorder, seen = Recorder(scripted), {}
    for seed in range(SEEDS):
        run_seed(3900 + seed, private_redis, scripted, recorder, seen)
    print(f"operations: {seen}")
    assert set(seen) == {"send", "regenerate", "edit", "switch", "stop", "kill", "delete"}, seen


@pytest.mark.parametrize("point", ["claimed", "published", "tool", "final"])
def test_a_branch_turn_whose_worker_is_lost_at_any_point_goes_on_on_its_own_branch(private_redis, tmp_path, point):
    """Every turn's first job in the conversation dies at `point` (SIGKILL, seen by its supervisor): before its first
    write (claimed), just after it (published), as its tool starts (tool), or as it writes its ending (final). A
    regenerate and an edit are each handed over and end on their own branch; the other branches keep theirs."""
    from harness import pools
    from tests.conftest import CANARY_KEY
    from tests.test_handover_seams import SEAMS

    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY, "PYTHONPATH": str(SEAMS),
           "SEAM_DIR": str(marks)}
    handle = pools.start_pool(private_redis.url, 3, tmp_path / "pool.log", env=env,
                              queue_connection=private_redis.queue_connection)
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 3)
        store, queue, config = private_redis.store, private_redis.queue, FAST.with_changes(**CLOCKS)
        cid = f"seam-{point}-first-kill-{new_id()[:8]}"

        def turn(text, branch_of=""):
            turn_id = submit_turn(store, queue, cid, text, config, branch_of=branch_of)
            final = wait_done(store, cid, TURN_S)
            assert final["turn_id"] == turn_id and final["status"] == "done", (point, final["status"], final["error"])
            assert (marks / f"turn-{turn_id}").exists(), f"its first job was not lost at {point}"
            return turn_id, final

        first, _ = turn("what is 1+1?")
        second, answered = turn("what is 2+2?")
        regenerated, final = turn("what is 2+2?", branch_of=second)
        assert final["siblings"] == [second, regenerated] and final["parent_turn_id"] == first
        assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["what is 1+1?", "what is 2+2?"]
        assert "4" in final["history"][-1]["content"]
        edited, final = turn("what is 3*3?", branch_of=second)
        assert final["siblings"] == [second, regenerated, edited] and final["parent_turn_id"] == first
        assert [m["content"] for m in final["history"] if m["role"] == "user"] == ["what is 1+1?", "what is 3*3?"]
        assert "9" in final["history"][-1]["content"]
        tool_calls = [c["id"] for m in final["history"] for c in m.get("tool_calls") or []]
        assert sorted(tool_calls) == sorted(m["tool_call_id"] for m in final["history"] if m["role"] == "tool")
        assert store.switch(cid, second) == second and store.read(cid)["history"] == answered["history"]
    finally:
        pools.stop_pool(handle, private_redis.url)
