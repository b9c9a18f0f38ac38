"""Conversations stored by the release before the tree (the flat shape: history, steps and turn summaries as three
lists) open and continue unchanged, with no step anyone runs: they are read as they are, and the first write moves
them into the tree (agent/conversation/scripts/included/tree.lua).

tests/data/flat_conversations.json holds what that release wrote (commit 5c058f9, its own CLI and workers with the
demo model): every key of four conversations, as Redis held them. "What is 12*7…" has three turns with tool steps,
"what is 3*9" a turn that asked for approval and was approved, "Will this one fail?" a turn that timed out, and
"what time is it in Paris" a plain one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from agent.conversation.keys import Keys
from agent.conversation.turns import split_turns
from tests.conftest import ROOT
from tests.test_resume import workers  # noqa: F401 - a fixture

DATA = ROOT / "tests" / "data" / "flat_conversations.json"
THREE_TURNS, APPROVED, TIMED_OUT, PLAIN = "2631530cd0184754", "6e7c695342084292", "f489c3760ffa483c", "854a28c12e644c2d"
CLI_TIMEOUT_S = 90
CLOCKS = {"AGENT_MODEL": "demo@0.05~0", "AGENT_JOB_TIMEOUT": "10", "AGENT_DEADLINE_MARGIN": "3",
          "AGENT_CALL_TIMEOUT_CAP": "4", "AGENT_CONNECT_TIMEOUT": "1", "AGENT_MIN_CALL_SECONDS": "0.5",
          "AGENT_WORKERS": "1"}


def load(client) -> dict:
    """The old release's keys, written as it wrote them (with a TTL, as every conversation has)."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for key, item in data.items():
        if item["type"] == "hash":
            client.hset(key, mapping=item["value"])
        elif item["type"] == "list":
            client.rpush(key, *item["value"])
        elif item["type"] == "zset":
            client.zadd(key, {member: score for member, score in item["value"]})
        client.expire(key, 3600)
    return data


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S)


def test_conversations_of_the_flat_shape_read_as_they_did(private_redis):
    data = load(private_redis.client)
    store = private_redis.store
    for cid in (THREE_TURNS, APPROVED, TIMED_OUT, PLAIN):
        state = store.read(cid)
        history = [json.loads(m) for m in data[f"agent:conv:{cid}:history"]["value"]]
        summaries = [json.loads(t) for t in data[f"agent:conv:{cid}:turns"]["value"]]
        assert state["done"] and [m["content"] for m in state["history"]] == [m["content"] for m in history]
        assert len(state["steps"]) == len(data[f"agent:conv:{cid}:steps"]["value"])
        assert [t["turn_id"] for t in state["turns"]] == [t["turn_id"] for t in summaries]
        parents = [None] + [t["turn_id"] for t in summaries[:-1]]
        assert [t["parent_turn_id"] for t in state["turns"]] == parents
        assert all(t["siblings"] == [t["turn_id"]] for t in state["turns"])
        assert len(split_turns(state)) == len(summaries)
        assert store.redis.exists(Keys.of(cid).history) == 1  # a read writes nothing
    assert len(store.read(THREE_TURNS)["turns"]) == 3
    assert store.read(TIMED_OUT)["status"] == "timed_out"
    approved = store.read(APPROVED)
    assert approved["approval"]["answer"] == "approved" and any(s["kind"] == "approval" for s in approved["steps"])
    tree = store.branches(THREE_TURNS)
    assert [t["depth"] for t in tree["turns"]] == [0, 1, 2] and all(t["shown"] for t in tree["turns"])


def test_a_conversation_of_the_flat_shape_opens_in_the_cli_and_continues_into_the_tree(private_redis, base_env):
    data = load(private_redis.client)
    store = private_redis.store
    env = {**base_env, **CLOCKS, "REDIS_URL": private_redis.url}
    before = store.read(THREE_TURNS)
    shown = cli({**env, "AGENT_WORKERS": "0"}, "show", THREE_TURNS)
    assert shown.returncode == 0, shown.stderr
    for message in before["history"]:
        if message["role"] == "user":
            assert message["content"] in shown.stdout.decode()

    asked = cli(env, "ask", "--conversation", THREE_TURNS, "--json", "What is 6*7?")
    assert asked.returncode == 0, asked.stderr
    final = json.loads(asked.stdout.decode().splitlines()[-1])
    assert final["done"] and final["status"] == "done" and "42" in final["history"][-1]["content"]
    state = store.read(THREE_TURNS)
    assert state["history"][: len(before["history"])] == before["history"]
    assert state["steps"][: len(before["steps"])] == before["steps"]
    assert state["turns"][:3] == before["turns"]
    assert state["turns"][3]["parent_turn_id"] == before["turns"][2]["turn_id"]
    keys = Keys.of(THREE_TURNS)
    assert store.redis.exists(keys.history, keys.steps, keys.turns) == 0 and store.redis.exists(keys.tree) == 1
    # The others were not touched.
    assert store.redis.lrange(Keys.of(PLAIN).history, 0, -1) == [
        m.encode() for m in data[f"agent:conv:{PLAIN}:history"]["value"]]

    branches = cli({**env, "AGENT_WORKERS": "0"}, "branches", THREE_TURNS, "--json")
    assert branches.returncode == 0, branches.stderr
    tree = json.loads(branches.stdout)
    assert [t["depth"] for t in tree["turns"]] == [0, 1, 2, 3] and tree["tip"] == state["turn_id"]
    assert tree["turns"][3]["first_words"] == "What is 6*7?"


def test_a_flat_conversation_can_be_regenerated_at_its_first_turn(private_redis):
    load(private_redis.client)
    store = private_redis.store
    before = store.read(THREE_TURNS)
    first = before["turns"][0]["turn_id"]
    message = store.turn_message(THREE_TURNS, first)
    assert message is None  # not in the tree yet: the first write moves it
    store.begin_turn(THREE_TURNS, "regenerated00001", before["history"][0],
                     {"status": "queued", "error": None, "job_id": "j", "enqueued_at": 0.0}, branch_of=first)
    state = store.read(THREE_TURNS)
    assert state["history"] == before["history"][:1] and state["siblings"] == [first, "regenerated00001"]
    assert store.turn_message(THREE_TURNS, first) == before["history"][0]


def test_a_turn_queued_by_the_release_before_the_tree_is_run_by_a_worker_of_this_one(private_redis, workers):  # noqa: F811
    """Its meta names the job that writes the turn `owner` (now `writer`): the job's claim moves it into the tree."""
    from agent.contract import queued_doc
    from agent.queue import enqueue_turn, job_id_for
    from tests.conftest import FAST, wait_done

    workers(1)
    store, cid, turn_id = private_redis.store, "flatinflight0001", "flatturn00000001"
    doc = queued_doc(FAST.to_dict(), job_id_for(turn_id), time.time())
    keys = Keys.of(cid)
    store.redis.hset(keys.meta, mapping={"turn_id": turn_id, "done": "0", "version": "1", "attempt": "0",
                                         "doc": json.dumps(doc), "owner": job_id_for(turn_id), "turns": "1",
                                         "title": "What is 6*7?"})
    store.redis.rpush(keys.history, json.dumps({"role": "user", "content": "What is 6*7?"}))
    assert store.read(cid)["job_id"] == job_id_for(turn_id)  # read in the flat shape, as it was written
    enqueue_turn(private_redis.queue, cid, turn_id, job_id_for(turn_id), job_timeout_s=FAST.job_timeout_s, wait_s=60)
    final = wait_done(store, cid, 30)
    assert final["status"] == "done" and "42" in final["history"][-1]["content"]
    assert [t["turn_id"] for t in final["turns"]] == [turn_id] and final["turns"][0]["parent_turn_id"] is None
    assert store.redis.hget(keys.meta, "owner") is None and store.redis.exists(keys.history) == 0


def test_a_write_by_another_job_to_a_flat_turn_in_flight_is_refused_as_in_the_tree(private_redis):
    """The release before named the job that writes a turn `owner`: a publish by any other job is refused (STALE), as
    the same write is once the conversation is in the tree, and the job that owns it writes on."""
    import pytest

    from agent.contract import queued_doc
    from agent.conversation.errors import StoreError
    from agent.queue import job_id_for
    from tests.conftest import FAST

    store, cid, turn_id = private_redis.store, "flatinflight0002", "flatturn00000002"
    doc = queued_doc(FAST.to_dict(), job_id_for(turn_id), time.time())
    keys = Keys.of(cid)
    store.redis.hset(keys.meta, mapping={"turn_id": turn_id, "done": "0", "version": "1", "attempt": "0",
                                         "doc": json.dumps(doc), "owner": job_id_for(turn_id), "turns": "1",
                                         "title": "What is 6*7?"})
    store.redis.rpush(keys.history, json.dumps({"role": "user", "content": "What is 6*7?"}))
    late = [{"role": "assistant", "content": "from a job that does not own the turn"}]
    with pytest.raises(StoreError) as info:
        store.publish(cid, turn_id, doc, new_messages=late, writer="turn-someone-else")
    assert info.value.reason == "STALE"
    assert "from a job" not in json.dumps(store.read(cid)["history"])
    store.publish(cid, turn_id, doc, new_messages=[{"role": "assistant", "content": "42"}],
                  writer=job_id_for(turn_id))
    assert [m["content"] for m in store.read(cid)["history"]] == ["What is 6*7?", "42"]
    with pytest.raises(StoreError) as info:  # in the tree now: the same refusal
        store.publish(cid, turn_id, doc, new_messages=late, writer="turn-someone-else")
    assert info.value.reason == "STALE"


def test_the_pools_watch_sees_the_job_of_a_flat_turn_in_flight(private_redis):
    """The watch finds a lost job by the writer the meta names: in a turn the release before left in flight, `owner`
    (not taken for a parked turn, which names none)."""
    store, cid = private_redis.store, "flatinflight0003"
    store.redis.hset(Keys.of(cid).meta, mapping={"turn_id": "flatturn00000003", "done": "0", "version": "1",
                                                 "attempt": "0", "owner": "turn-flatturn00000003"})
    assert store.flags.writers([cid]) == [("flatturn00000003", "0", "turn-flatturn00000003", "0")]
    store.redis.hset(Keys.of(cid).meta, "writer", "")  # in the tree, parked: no job
    assert store.flags.writers([cid]) == [("flatturn00000003", "0", "", "0")]
