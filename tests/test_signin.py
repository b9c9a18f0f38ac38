"""Signed-in people: each conversation has an owner, and a person's store (PersonStore) is the door to
their own conversations only; at most AGENT_MAX_TURNS_PER_USER of a person's turns are in flight, and a
person's backlog waits outside the queue (RQ's RateLimit), so another person's first turn is not behind it.

Real Redis, real RQ workers (the session's pool) and the demo model on loopback; tests wait for events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.conversation import people
from agent.conversation.errors import ConversationGone, StoreError, TooManyTurns
from agent.conversation.listing import list_conversations
from agent.conversation.person_store import PersonStore
from agent.queue import get_queue, job_status, new_id, submit_turn
from agent.tools.notes import notes_path, read_notes
from agent.turn import approvals
from harness import pools
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, start_pool, wait_done

ISSUER = "http://127.0.0.1:9/oidc"
SLOW = FAST.with_changes(model="demo@1~0", job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=10.0)


def person(subject: str, email: str = "", admin: bool = False) -> people.Person:
    found = people.from_claims({"iss": ISSUER, "sub": subject, "email": email, "email_verified": bool(email)},
                               frozenset({email}) if admin else frozenset())
    assert found is not None
    return found


def door(store, who: people.Person, max_turns: int = 0):
    return PersonStore(store, who.id, admin=who.admin, max_turns=max_turns)


def send(store, queue, text: str, cid: str | None = None, config=FAST, share: int = 0) -> str:
    cid = cid or new_id()
    submit_turn(store, queue, cid, text, config, share=share)
    return cid


def test_a_person_id_is_a_digest_of_issuer_and_subject_never_the_email():
    alice = person("alice-sub", "Alice@Example.org")
    assert alice.id.startswith("p") and len(alice.id) == 21
    assert "alice" not in alice.id.lower()
    assert alice.email == "alice@example.org" and alice.name == "alice@example.org"
    assert person("alice-sub").id == alice.id  # the same subject at the same issuer: the same person
    assert people.from_claims({"iss": "https://other", "sub": "alice-sub"}).id != alice.id
    assert people.from_claims({"sub": "x"}) is None and people.from_claims({"iss": ISSUER, "sub": 7}) is None


def test_each_person_reads_lists_and_writes_only_their_own(store, queue, pool):
    alice, bob = person("alice", "alice@example.org"), person("bob", "bob@example.org")
    as_alice, as_bob = door(store, alice), door(store, bob)
    cid = send(as_alice, queue, "What is 2+3?")
    ended = wait_done(as_alice, cid)
    assert ended["owner"] == alice.id and ended["status"] == "done"
    assert [row.conversation_id for row in list_conversations(as_alice).conversations] == [cid]

    # To Bob it does not exist, by every path: the poll, the reads, the list, the writes.
    assert as_bob.version(cid) is None and as_bob.read(cid) is None and as_bob.read_meta(cid) is None
    assert list_conversations(as_bob).conversations == []
    assert as_bob.rename(cid, "mine now") is False
    with pytest.raises(ConversationGone) as refused:
        submit_turn(as_bob, queue, cid, "hello", FAST)
    assert "was not found" in str(refused.value)
    with pytest.raises(StoreError):
        as_bob.publish(cid, ended["turn_id"], {**ended, "status": "cancelled"}, done=True)
    assert as_bob.delete(cid) is False
    assert as_bob.was_deleted(cid) is False

    after = store.read(cid)  # nothing of Bob's reached it
    assert after["version"] == ended["version"] and len(after["history"]) == len(ended["history"])
    assert store.read_meta(cid) is not None and list_conversations(as_bob).total == 0

    # Alice deletes it: her link says deleted; Bob's says not found, as before.
    assert as_alice.rename(cid, "Sums") is True
    assert as_alice.delete(cid) is True
    assert as_alice.was_deleted(cid) is True and as_bob.was_deleted(cid) is False


def test_an_admin_reads_everyones_and_changes_none(store, queue, pool):
    alice, admin = person("alice-2", "a2@example.org"), person("root", "root@example.org", admin=True)
    as_alice, as_admin = door(store, alice), door(store, admin)
    cid = send(as_alice, queue, "What is 6*7?")
    wait_done(as_alice, cid)
    assert as_admin.read(cid) is not None and not as_admin.owns(as_admin.read(cid))
    assert cid in [row.conversation_id for row in list_conversations(as_admin, limit=1000).conversations]
    assert as_admin.rename(cid, "admin's") is False and as_admin.delete(cid) is False
    with pytest.raises(ConversationGone):
        submit_turn(as_admin, queue, cid, "hi", FAST)
    assert store.read(cid)["turns"][-1]["status"] == "done"


def test_an_operator_conversation_is_nobodys_and_a_local_one_stays_everyones(store, queue, pool):
    cid = send(store, queue, "What is 1+1?")  # the CLI and the local playground: no owner
    state = wait_done(store, cid)
    assert state["owner"] is None
    as_alice = door(store, person("alice-3"))
    assert as_alice.read(cid) is None
    with pytest.raises(ConversationGone):
        submit_turn(as_alice, queue, cid, "mine?", FAST)
    send(store, queue, "And 2+2?", cid=cid)  # the operator continues it as before
    assert wait_done(store, cid)["owner"] is None


def test_turns_in_flight_past_the_cap_are_refused_and_nothing_is_written(store, queue, pool):
    carol = person("carol")
    as_carol = door(store, carol, max_turns=2)
    first = send(as_carol, queue, "Please be slow 2 seconds, then tell me the time.", config=SLOW)
    second = send(as_carol, queue, "Please be slow 2 seconds, then tell me the time.", config=SLOW)
    third = new_id()
    with pytest.raises(TooManyTurns) as refused:
        submit_turn(as_carol, queue, third, "one more", FAST)
    assert "2 turns in flight" in str(refused.value) and "AGENT_MAX_TURNS_PER_USER" in str(refused.value)
    assert store.read(third) is None  # refused whole: no conversation was started
    # Someone else is not held back by Carol's turns.
    dave_cid = send(door(store, person("dave"), max_turns=2), queue, "What is 3+4?")
    wait_done(store, dave_cid)
    wait_done(store, first, timeout_s=30)
    send(as_carol, queue, "What is 5+5?", cid=third)  # one of hers ended: there is room again
    wait_done(store, third)
    wait_done(store, second, timeout_s=30)


def test_a_persons_backlog_waits_outside_the_queue_and_anothers_first_turn_goes_first(store, queue, pool):
    """With a share of 2 (one per worker): Erin's 5 turns take the 2 workers, the other 3 wait outside the
    queue; Frank's one turn, sent after all of them, starts when the first of Erin's running turns ends,
    before any of Erin's waiting ones."""
    as_erin = door(store, person("erin"), max_turns=20)
    as_frank = door(store, person("frank"), max_turns=20)
    erin = [send(as_erin, queue, "What is 1+2, and what time is it?", config=SLOW, share=2) for _ in range(5)]
    wait_for(lambda: sum(store.read_meta(cid)["status"] == "running" for cid in erin) == 2, timeout_s=10,
             what="two of Erin's turns running")
    held = [cid for cid in erin if job_status(queue.connection, store.read_meta(cid)["job_id"]) == "rate_limited"]
    assert len(held) == 3, [job_status(queue.connection, store.read_meta(cid)["job_id"]) for cid in erin]
    frank = send(as_frank, queue, "What is 3*3?", config=SLOW, share=2)
    finished = [wait_done(store, cid, timeout_s=60) for cid in [*erin, frank]]
    started = {state["conversation_id"]: state["turns"][-1]["started_at"] for state in finished}
    assert all(started[frank] < started[cid] for cid in held), started
    assert get_queue(queue.connection).count == 0


def test_the_job_carries_no_identity_the_worker_reads_the_owner_from_the_state(store, queue, pool):
    grace = person("grace", "grace@example.org")
    cid = send(door(store, grace), queue, "What is 8*8?")
    state = wait_done(store, cid)
    job = queue.fetch_job(state["job_id"])
    assert list(job.args) == [cid, state["turn_id"]] and not job.kwargs
    assert grace.id not in json.dumps([job.args, job.kwargs, job.meta, job.description])
    assert state["owner"] == grace.id


def test_an_approval_is_answered_only_by_its_owner(store, queue, pool):
    heidi, ivan = person("heidi"), person("ivan")
    as_heidi, as_ivan = door(store, heidi), door(store, ivan)
    cid = send(as_heidi, queue, "What is 17*23?", config=FAST.with_changes(approve_tools=("calculator",)))
    wait_for(lambda: (s := store.read(cid)) is not None and s["status"] == "awaiting_approval", timeout_s=10,
             what="the turn parked")
    refused = approvals.answer(as_ivan, queue, cid, "approved", "by ivan on the page")
    assert refused.outcome == "gone"
    assert store.read(cid)["status"] == "awaiting_approval"
    taken = approvals.answer(as_heidi, queue, cid, "approved", "by heidi on the page")
    assert taken.outcome == "ok"
    assert wait_done(store, cid)["status"] == "done"


def test_cli_list_and_show_take_an_owner(store, queue, pool, redis_url, base_env):
    judy = person("judy", "judy@example.org")
    people.remember(store.redis, judy)
    cid = send(door(store, judy), queue, "What is 9+9?")
    wait_done(store, cid)
    other = send(store, queue, "What is 4+4?")
    wait_done(store, other)
    env = {**base_env, "REDIS_URL": redis_url}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=60)

    listed = cli("list", "--owner", "JUDY@example.org", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["conversation_id"] for line in listed.stdout.splitlines()] == [cid]
    shown = cli("show", cid, "--owner", judy.id)
    assert shown.returncode == 0 and f"owner: judy@example.org <judy@example.org> ({judy.id})" in shown.stdout
    mismatch = cli("show", other, "--owner", "judy@example.org")
    assert mismatch.returncode == 2 and f"judy@example.org has no conversation {other}" in mismatch.stderr
    nobody = cli("list", "--owner", "nobody@example.org")
    assert nobody.returncode == 2 and "nobody has signed in as" in nobody.stderr
    everyone = cli("list", "--json", "--limit", "1000")
    ids = {json.loads(line)["conversation_id"] for line in everyone.stdout.splitlines()}
    assert {cid, other} <= ids  # the operator sees everything


def test_admins_setting_is_checked_at_start():
    from agent.settings import Settings, SettingsError
    assert Settings.from_env({"AGENT_ADMINS": " Root@Example.org , b@x.io"}).admins == {"root@example.org", "b@x.io"}
    with pytest.raises(SettingsError, match="AGENT_ADMINS"):
        Settings.from_env({"AGENT_ADMINS": "not an email"})
    with pytest.raises(SettingsError, match="AGENT_MAX_TURNS_PER_USER"):
        Settings.from_env({"AGENT_MAX_TURNS_PER_USER": "0"})
    assert Settings.from_env({}).max_turns_per_user == 2 and os.environ.get("AGENT_ADMINS") is None


@pytest.mark.parametrize("claims", [
    {}, {"iss": None, "sub": None}, {"iss": ISSUER, "sub": ""}, {"iss": ISSUER, "sub": ["a"]},
    {"iss": {"x": 1}, "sub": "a"}, {"iss": ISSUER, "sub": "a", "email": 7, "name": None},
    {"iss": ISSUER, "sub": "a", "email": ["x@y"], "name": {"first": "x"}},
    {"iss": ISSUER, "sub": "\x00\u202e" * 500, "name": "*bold* <b>x</b>" * 100, "email": "A@B.C\n"},
    {"iss": ISSUER, "sub": "\ud800", "email": "\ud800@x"},
])
def test_claims_of_any_shape_give_a_person_or_none_never_an_error(claims, redis_client):
    found = people.from_claims(claims, frozenset({"a@b.c"}))
    if found is not None:
        assert found.id.startswith("p") and len(found.id) == 21 and len(found.name) <= 80
        assert isinstance(found.email, str) and isinstance(found.admin, bool)
        people.remember(redis_client, found)  # what the operator's --owner finds them by
        assert people.find(redis_client, found.id) == found.id


def test_a_trace_carries_the_owners_id_and_their_email_only_when_asked(store, queue, pool, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent import tracing

    kim = person("kim", "kim@example.org")
    people.remember(store.redis, kim)
    cid = send(door(store, kim), queue, "What is 2*21?")
    turn_id = wait_done(store, cid)["turn_id"]
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        def turn_span():
            exporter.clear()
            tracing.turn_ended(store, cid, turn_id)  # what the worker calls after its final write
            return next(s for s in exporter.get_finished_spans() if s.name == tracing.TURN_SPAN)

        plain = turn_span()
        assert plain.attributes["user.id"] == kim.id and "user.email" not in plain.attributes
        assert not any("kim@" in str(v) for s in exporter.get_finished_spans() for v in s.attributes.values())
        monkeypatch.setenv(tracing.OWNER_EMAIL_VARIABLE, "true")
        assert turn_span().attributes["user.email"] == "kim@example.org"
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def test_an_admin_is_named_by_a_verified_email_or_by_id_and_never_by_a_look_alike():
    admins = frozenset({"kate@example.org", people.person_id(ISSUER, "ops")})

    def admin(**claims) -> bool:
        return people.from_claims({"iss": ISSUER, "sub": "x", **claims}, admins).admin

    assert admin(email="Kate@Example.org", email_verified=True)
    assert not admin(email="kate@example.org")  # a provider that let anyone type it did not vouch for it
    assert not admin(email="kate@example.org", email_verified="yes")
    assert not admin(email="\u212aate@example.org", email_verified=True)  # the Kelvin sign folds to K
    assert people.from_claims({"iss": ISSUER, "sub": "ops"}, admins).admin  # by id: no email needed
    assert people.person_id("ab", "c") != people.person_id("a", "bc")  # no two pairs make one text


def test_only_a_verified_email_finds_a_person_for_the_operator(redis_client):
    mallory = people.from_claims({"iss": ISSUER, "sub": "mallory", "email": "victim-x@example.org"})
    people.remember(redis_client, mallory)
    assert people.find(redis_client, "victim-x@example.org") is None
    victim = person("victim-x", "victim-x@example.org")
    people.remember(redis_client, victim)
    assert people.find(redis_client, "VICTIM-X@example.org") == victim.id


def test_admins_may_be_named_by_id_and_a_non_ascii_email_is_refused():
    from agent.settings import Settings, SettingsError
    pid = people.person_id(ISSUER, "ops")
    assert Settings.from_env({"AGENT_ADMINS": f"{pid}, Ops@Example.org"}).admins == {pid, "ops@example.org"}
    with pytest.raises(SettingsError, match="AGENT_ADMINS"):
        Settings.from_env({"AGENT_ADMINS": "\u212aate@example.org"})


def test_stop_ends_a_turn_held_behind_the_persons_own_at_once_and_frees_its_place(store, queue, pool):
    from agent.ui import state as ui
    as_lee = door(store, person("lee"), max_turns=5)
    cids = [send(as_lee, queue, "Please be slow 4 seconds, then tell me the time.", config=SLOW, share=2)
            for _ in range(3)]
    held = store.read(cids[-1])
    assert job_status(queue.connection, held["job_id"]) == "rate_limited"
    ui.stop(as_lee, {}, held, 60, queue.connection)
    ended = store.read(cids[-1])
    assert ended["done"] and ended["status"] == "cancelled"
    assert job_status(queue.connection, held["job_id"]) in (None, "canceled")
    for cid in cids[:2]:
        wait_done(store, cid, timeout_s=40)


def test_a_turn_whose_job_was_lost_does_not_hold_a_place_against_the_cap(store, queue, pool):
    import time

    from agent.contract import queued_doc
    from agent.ui import state as ui
    as_mia = door(store, person("mia"), max_turns=1)
    lost = new_id()
    # A turn begun whose job never reached the queue (the sender was killed in between), 10 s ago.
    as_mia.begin_turn(lost, new_id(), {"role": "user", "content": "lost"},
                      queued_doc(FAST.to_dict(), "turn-" + new_id(), time.time() - 10))
    session = {}
    fresh = new_id()
    assert ui.send(as_mia, queue, session, fresh, "What is 1+1?", FAST) is not None, session.get(ui.FLASH_KEY)
    assert store.read(lost)["done"] and wait_done(store, fresh)["status"] == "done"


def _noted(store, queue, text: str) -> dict:
    """A turn that asks for a note, approved by its owner: its final state."""
    cid = send(store, queue, text)
    wait_for(lambda: (s := store.read(cid)) is not None and s["status"] == "awaiting_approval", timeout_s=10,
             what="the turn asked to add the note")
    assert approvals.answer(store, queue, cid, "approved", "on the page").outcome == "ok"
    return wait_done(store, cid)


def test_each_persons_add_note_writes_their_own_notes_the_worker_names_whose(private_redis, tmp_path, monkeypatch):
    data = tmp_path / "data"  # the workers' data directory, and this test's own
    monkeypatch.setenv("AGENT_DATA_DIR", str(data))
    handle = start_pool(private_redis.url, 1, tmp_path / "pool.log", extra_env={"AGENT_DATA_DIR": str(data)})
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 1)
        queue = private_redis.queue
        kate, leo = person("kate"), person("leo")
        for who, text in ((kate, "note: buy milk"), (leo, "note: call Bob"), (None, "note: water the plants")):
            ended = _noted(private_redis.store if who is None else door(private_redis.store, who), queue, text)
            assert ended["status"] == "done"
            tool_result = next(m for m in ended["history"] if m["role"] == "tool")["content"]
            assert tool_result == ("Added note 1 to your notes." if who else "Added note 1 to notes.txt.")
        assert [line.split(" ", 1)[1] for line in read_notes(person=kate.id)] == ["buy milk"]
        assert [line.split(" ", 1)[1] for line in read_notes(person=leo.id)] == ["call Bob"]
        assert [line.split(" ", 1)[1] for line in read_notes()] == ["water the plants"]  # a turn with no owner
        assert notes_path(kate.id).parent == data / "notes"
    finally:
        pools.stop_pool(handle, private_redis.url)
