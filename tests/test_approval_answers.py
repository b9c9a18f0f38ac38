"""What an answer to a request for approval does, beyond being taken once (agent/turn/approvals.py,
scripts/answer.lua): a person's answer after the request expired by Redis's clock is refused (the request is
expired instead); an answer whose continuation never reached the queue stands, and the pool's watch enqueues
that continuation (a front end meanwhile does not end the turn as lost); continuations count against their
owner's fair share of the workers; an admin's answer on someone else's turn is told it is read-only.

Real Redis (the session's, or a test's own), real RQ workers, the demo model.
"""

from __future__ import annotations

import subprocess
import sys
import time

import redis

from agent.contract import Outcome, Status, carried
from agent.conversation.keys import Keys
from agent.hosting.lost_worker import lost_worker_check
from agent.providers.base import ToolCall
from agent.queue import SafeJob, get_queue, job_status, new_id, submit_turn
from agent.runtime.connection import queue_client
from agent.turn import approvals, continuations
from agent.turn.approvals import BY_CLI, BY_NOBODY, BY_PAGE
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, wait_done
from tests.test_app import app_env  # noqa: F401 - the page's environment
from tests.test_approvals import ASKS, parked, tool_results
from tests.test_resume import workers  # noqa: F401 - a pool on a test's own Redis
from tests.test_signin import SLOW, door, person, send

MARGIN_S = 1.0  # seconds of slack on every time bound


def park_by_hand(store, queue, expires_in_s: float) -> tuple[str, dict]:
    """A turn parked on a request for approval of calculator(6*7) that expires `expires_in_s` from now, on a
    Redis no worker serves (so no watch expires it first): (conversation id, request)."""
    cid = new_id()
    submit_turn(store, queue, cid, "what is 6*7?", ASKS)
    state = store.read_meta(cid)
    writer = store.redis.hget(Keys.of(cid).meta, "writer").decode()
    now = time.time()
    request = approvals.request_for(ToolCall("call_1", "calculator", '{"expression": "6*7"}'), ASKS, now, 0)
    request["expires_at"] = now + expires_in_s
    doc = carried(state)
    doc.update(status=Status.AWAITING_APPROVAL, approval=request)
    store.park(cid, state["turn_id"], writer, doc, request_id=request["id"], expires_at=request["expires_at"],
               ttl_s=600)
    return cid, request


def test_an_answer_after_expiry_by_redis_clock_is_refused_and_the_request_expires(private_redis):
    store, queue = private_redis.store, private_redis.queue
    in_time, request = park_by_hand(store, queue, expires_in_s=30)
    assert approvals.answer(store, queue, in_time, Outcome.APPROVED, BY_PAGE, request_id=request["id"]).taken

    cid, request = park_by_hand(store, queue, expires_in_s=0.3)
    wait_for(lambda: time.time() > request["expires_at"] + 0.05, 2, "the request's expiry")
    # The answerer's own clock says there is time left (a page's, a CLI's, behind Redis's): Redis's decides.
    late = approvals.answer(store, queue, cid, Outcome.APPROVED, BY_PAGE, request_id=request["id"],
                            now=request["expires_at"] - 5)
    assert late.outcome == "answered" and "Too late" in late.message and "not run" in late.message
    state = store.read(cid)
    assert state["approval"]["answer"] == Outcome.EXPIRED and state["approval"]["answered_by"] == BY_NOBODY
    assert [s["outcome"] for s in state["steps"] if s["kind"] == "approval"] == [Outcome.EXPIRED]
    # The expiry itself is never late.
    other, request = park_by_hand(store, queue, expires_in_s=0.1)
    wait_for(lambda: time.time() > request["expires_at"] + 0.05, 2, "the request's expiry")
    assert approvals.expire_due(store, queue) >= 1
    assert store.read(other)["approval"]["answer"] == Outcome.EXPIRED


def test_an_answer_whose_continuation_never_reached_the_queue_stands_and_the_watch_queues_it(pool, store, queue):
    cid = send(store, queue, "what is 6*7?", config=ASKS)
    request = parked(store, cid)["approval"]
    # Redis goes away between the answer and its job: the queue's connection points nowhere.
    nowhere = get_queue(queue_client("redis://127.0.0.1:9/0"))
    answered = approvals.answer(store, nowhere, cid, Outcome.APPROVED, BY_CLI, request_id=request["id"])
    assert answered.taken and not answered.queued and "watch queues it" in answered.message
    state = store.read_meta(cid)
    assert state["status"] == Status.QUEUED and not SafeJob.exists(state["job_id"], connection=queue.connection)
    # A page that opens it meanwhile does not end it as lost: the answer stands.
    assert not lost_worker_check(store, queue.connection, cid)
    assert not store.read_meta(cid)["done"]
    final = wait_done(store, cid, timeout_s=continuations.GRACE_S + 20)
    assert final["status"] == Status.DONE, final["error"]
    assert tool_results(final)[request["call_id"]] == "42"
    # Its entry in the watch's index goes at its next look, the turn having moved on.
    wait_for(lambda: store.redis.zscore("agent:approvals:continuing", cid) is None,
             continuations.GRACE_S + 1 + MARGIN_S, "the continuation forgotten")


def test_continuations_count_against_their_owners_share(store, queue, pool):
    """With a share of 2 (one per worker): Erin's 6 approved continuations hold at most 2 places; Frank's
    first turn, sent after all the answers, starts before the 4 others."""
    # Each of Erin's model calls takes 3 s: none of her continuations ends, and releases the next, before Frank's
    # turn is sent, however slowly a busy machine gets from the answers to his message.
    asks = SLOW.with_changes(approve_tools=("calculator",), model="demo@3~0")
    as_erin, as_frank = door(store, person("erin-asks"), max_turns=20), door(store, person("frank-asks"), max_turns=20)
    erin = [send(as_erin, queue, "What is 6*7?", config=asks, share=2) for _ in range(6)]
    requests = [wait_for(lambda c=cid: (s := store.read(c)) and s["status"] == Status.AWAITING_APPROVAL
                         and s["approval"], 60, "Erin's turns to park") for cid in erin]
    for cid, request in zip(erin, requests, strict=True):
        assert approvals.answer(as_erin, queue, cid, Outcome.APPROVED, BY_PAGE, request_id=request["id"]).taken
    held = [cid for cid in erin if job_status(queue.connection, store.read_meta(cid)["job_id"]) == "rate_limited"]
    assert len(held) >= 4, [job_status(queue.connection, store.read_meta(cid)["job_id"]) for cid in erin]
    frank = send(as_frank, queue, "What is 3*3?", config=SLOW, share=2)
    finished = {cid: wait_done(store, cid, timeout_s=90) for cid in [*erin, frank]}
    started = {cid: state["turns"][-1]["started_at"] for cid, state in finished.items()}
    before_frank = [cid for cid in erin if started[cid] < started[frank]]
    assert len(before_frank) <= 2, (started, frank)
    assert all(tool_results(finished[cid])[r["call_id"]] == "42" for cid, r in zip(erin, requests, strict=True))


def test_an_admins_answer_on_someone_elses_turn_says_it_is_read_only(store, queue, pool):
    owner, admin = person("kim-asks"), person("root-asks", "root@example.org", admin=True)
    cid = send(door(store, owner), queue, "What is 6*7?", config=FAST.with_changes(approve_tools=("calculator",)))
    request = parked(store, cid)["approval"]
    as_admin = door(store, admin)
    refused = approvals.answer(as_admin, queue, cid, Outcome.APPROVED, "by root on the page",
                               request_id=request["id"])
    assert refused.outcome == "read-only" and "read-only for you" in refused.message
    assert "Nothing to answer" not in refused.message
    assert store.read(cid)["status"] == Status.AWAITING_APPROVAL
    assert approvals.answer(door(store, owner), queue, cid, Outcome.DENIED, BY_PAGE, request_id=request["id"]).taken
    wait_done(store, cid)


def test_with_redis_full_an_answer_is_recorded_whole_or_not_at_all_and_its_turn_goes_on(
        private_redis, workers, base_env):  # noqa: F811
    """Redis a few KiB short of its limit: the answer's script may pass and the enqueue after it fail, or the
    script itself be refused (nothing recorded). Either way nothing is half done: once memory is freed, the
    pool's watch queues the continuation and the turn ends with the tool's result."""
    store, queue, client = private_redis.store, private_redis.queue, private_redis.client
    recorded = None
    for slack in range(256, 16_384, 256):  # how much room the answer finds varies a little from run to run
        cid, request = park_by_hand(store, queue, expires_in_s=600)
        client.config_set("maxmemory", used_memory(client) + slack)
        try:
            answered = approvals.answer(store, queue, cid, Outcome.APPROVED, BY_CLI, request_id=request["id"])
        except redis.RedisError:  # the script refused whole: nothing recorded, the request still waits
            client.config_set("maxmemory", 0)
            assert store.read_meta(cid)["approval"]["answer"] is None
            continue
        finally:
            client.config_set("maxmemory", 0)
        if answered.taken and not answered.queued:
            recorded = cid, request
            break
    assert recorded is not None, "no room found where the answer fits and its job does not"
    cid, request = recorded
    state = store.read_meta(cid)
    assert state["status"] == Status.QUEUED and not SafeJob.exists(state["job_id"], connection=queue.connection)
    # The command line, Redis full: one line, never a traceback.
    other, other_request = park_by_hand(store, queue, expires_in_s=600)
    client.config_set("maxmemory", used_memory(client) - 1_000_000)
    try:
        cli = subprocess.run([sys.executable, "-m", "agent", "approve", other, "--request", other_request["id"]],
                             cwd=ROOT, env={**base_env, "REDIS_URL": private_redis.url}, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        client.config_set("maxmemory", 0)
    assert "Traceback" not in cli.stderr and cli.stderr.count("\n") == 1, cli.stderr
    assert cli.returncode == 1 and "Redis is full" in cli.stderr
    # Memory freed, a pool (and its watch) running: the answered turn goes on.
    workers(1)
    final = wait_done(store, cid, timeout_s=continuations.GRACE_S + 30)
    assert final["status"] == Status.DONE, final["error"]
    assert tool_results(final)[request["call_id"]] == "42"


def used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def test_an_admins_page_on_someone_elses_parked_turn_says_it_is_read_only(store, queue, pool, monkeypatch,
                                                                          app_env):  # noqa: F811
    from tests.apptest_page import texts
    from tests.test_signin_page import signed

    monkeypatch.setenv("AGENT_ADMINS", "boss-asks@example.org")
    owner, boss = person("lee-asks", "lee-asks@example.org"), person("boss-asks", "boss-asks@example.org")
    cid = send(door(store, owner), queue, "What is 6*7?", config=FAST.with_changes(approve_tools=("calculator",)))
    request = parked(store, cid)["approval"]
    at = signed(boss, cid)
    page = texts(at)
    assert "read-only for you" in page and "Waiting for your approval" not in page, page[-1500:]
    assert f"approve-{request['id']}" not in [b.key for b in at.button]
    assert approvals.answer(door(store, owner), queue, cid, Outcome.DENIED, BY_PAGE, request_id=request["id"]).taken
    wait_done(store, cid)
