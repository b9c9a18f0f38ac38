"""Conversations as trees, in the store on a real Redis: each turn a record of its own, a branch that copies
nothing, the path shown, switching, and the refusals and protections of a plain turn, per turn."""

from __future__ import annotations

import time

import pytest

from agent.contract import turn_summary
from agent.conversation import reads
from agent.conversation.errors import NoSuchTurn, StoreError, TurnInFlight
from agent.conversation.keys import Keys
from agent.queue import new_id
from tests.tree_model import Model

DOC = {"status": "queued", "error": None, "job_id": "j", "enqueued_at": 0.0}


def ask(store, cid, text, *, branch_of="", tid=None):
    tid = tid or new_id()
    store.begin_turn(cid, tid, {"role": "user", "content": text}, DOC, branch_of=branch_of)
    return tid


def answer(store, cid, tid, text, status="done"):
    doc = {**DOC, "status": status}
    store.publish(cid, tid, doc, done=True, new_messages=[{"role": "assistant", "content": text}],
                  new_steps=[{"turn_id": tid, "index": 1, "kind": "model", "name": "m", "outcome": "ok"}],
                  summary=turn_summary(tid, doc, time.time()))


def texts(state):
    return [m["content"] for m in state["history"]]


def test_a_regenerate_and_an_edit_are_siblings_and_the_state_shows_one_path(store):
    cid = new_id()
    first = ask(store, cid, "a")
    answer(store, cid, first, "A")
    second = ask(store, cid, "b")
    answer(store, cid, second, "B1")
    again = ask(store, cid, "b", branch_of=second)  # a regenerate: same message, same parent
    answer(store, cid, again, "B2")
    state = store.read(cid)
    assert texts(state) == ["a", "A", "b", "B2"]
    assert state["turn_id"] == again and state["parent_turn_id"] == first and state["siblings"] == [second, again]
    assert [t["turn_id"] for t in state["turns"]] == [first, again]
    assert state["turns"][0]["parent_turn_id"] is None and state["turns"][0]["siblings"] == [first]
    assert state["turns"][1]["parent_turn_id"] == first and state["turns"][1]["siblings"] == [second, again]
    assert [s["turn_id"] for s in state["steps"]] == [first, again]  # the steps of the path only

    edited = ask(store, cid, "c", branch_of=first)  # an edit of the first message: a new first turn
    answer(store, cid, edited, "C")
    state = store.read(cid)
    assert texts(state) == ["c", "C"] and state["siblings"] == [first, edited] and state["parent_turn_id"] is None

    assert store.switch(cid, first) == again  # down the branch to its latest turn
    state = store.read(cid)
    assert texts(state) == ["a", "A", "b", "B2"] and state["turn_id"] == again and state["done"]
    assert store.switch(cid, second) == second
    state = store.read(cid)
    assert texts(state) == ["a", "A", "b", "B1"] and state["turn_id"] == second and state["status"] == "done"
    following = ask(store, cid, "d")  # sending continues the branch shown
    assert texts(store.read(cid)) == ["a", "A", "b", "B1", "d"]
    assert store.read(cid)["parent_turn_id"] == second
    answer(store, cid, following, "D")
    tree = store.branches(cid)
    assert [(t["turn_id"], t["depth"]) for t in tree["turns"]] == [
        (first, 0), (second, 1), (following, 2), (again, 1), (edited, 0)]
    assert tree["tip"] == following and [t["turn_id"] for t in tree["turns"] if t["shown"]] == [
        first, second, following]
    assert tree["turns"][3]["first_words"] == "b" and tree["turns"][3]["status"] == "done"


def test_a_branch_copies_nothing_it_writes_what_a_second_turn_writes(store):
    def regenerate_at(turns: int) -> tuple[int, int]:
        cid = new_id()
        for n in range(turns):
            last = ask(store, cid, f"question {n}")
            answer(store, cid, last, f"answer {n}")
        tree_key = Keys.of(cid).tree
        before = store.redis.hgetall(tree_key)
        regenerated = ask(store, cid, f"question {turns - 1}", branch_of=last, tid=f"{turns:016d}")
        answer(store, cid, regenerated, "again")
        after = store.redis.hgetall(tree_key)
        written = {field: value for field, value in after.items() if before.get(field) != value}
        return len(after) - len(before), sum(len(field) + len(value) for field, value in written.items())

    at_two, at_forty = regenerate_at(2), regenerate_at(40)
    # its parent, depth, root, messages, steps, version, summary, small fields, and the log of added turns
    assert at_two[0] == at_forty[0] == 12
    assert abs(at_forty[1] - at_two[1]) <= 0.1 * at_two[1]


def test_edit_regenerate_and_switch_are_refused_while_a_turn_is_in_flight_and_name_a_turn(store):
    cid = new_id()
    first = ask(store, cid, "a")
    with pytest.raises(TurnInFlight) as info:
        ask(store, cid, "again", branch_of=first)
    assert "Stop it first" in str(info.value)
    with pytest.raises(TurnInFlight):
        store.switch(cid, first)
    answer(store, cid, first, "A")
    with pytest.raises(NoSuchTurn):
        ask(store, cid, "x", branch_of="no-such-turn")
    with pytest.raises(NoSuchTurn):
        store.switch(cid, "no-such-turn")
    assert texts(store.read(cid)) == ["a", "A"]


def test_the_protections_of_a_write_hold_per_turn(store):
    cid = new_id()
    first = ask(store, cid, "a")
    answer(store, cid, first, "A")
    second = ask(store, cid, "b", branch_of=first)
    with pytest.raises(StoreError) as info:  # an ended turn on another branch
        store.publish(cid, first, DOC, new_messages=[{"role": "assistant", "content": "late"}])
    assert info.value.reason == "STALE"
    with pytest.raises(StoreError) as info:  # the turn's messages moved
        store.publish(cid, second, DOC, new_messages=[{"role": "assistant", "content": "x"}], expected_turn_len=2)
    assert info.value.reason == "CONFLICT"
    store.publish(cid, second, DOC, new_messages=[{"role": "assistant", "content": "x"}], expected_turn_len=1)
    with pytest.raises(StoreError) as info:  # another job writes it
        store.publish(cid, second, DOC, writer="someone-else")
    assert info.value.reason == "STALE"
    step = {"turn_id": second, "index": 1, "kind": "model", "name": "m", "outcome": "ok"}
    store.publish(cid, second, DOC, new_steps=[step], writer="j")
    store.publish(cid, second, DOC, new_steps=[step], writer="j")  # a write run twice stores its step once
    assert [s["turn_id"] for s in store.read(cid)["steps"]] == [second]


def test_a_reader_fetches_a_turn_once_then_only_what_is_new(store):
    cid = new_id()
    first = ask(store, cid, "a")
    answer(store, cid, first, "A")
    second = ask(store, cid, "b")
    known = store.read(cid)
    fetched = []
    real = reads._fetch_turns
    reads._fetch_turns = lambda client, c, wanted: (fetched.extend(w[0] for w in wanted), real(client, c, wanted))
    try:
        store.publish(cid, second, DOC, new_messages=[{"role": "assistant", "content": "B"}])
        known = store.read_since(cid, known)  # the same tree: only the new message
        assert texts(known) == ["a", "A", "b", "B"] and fetched == []
        answer(store, cid, second, "B!")
        known = store.read_since(cid, known)
        assert texts(known) == ["a", "A", "b", "B", "B!"] and [t["turn_id"] for t in known["turns"]] == [
            first, second]
        regenerated = ask(store, cid, "b", branch_of=second)
        known = store.read_since(cid, known)  # another path: only the turn not read before
        assert texts(known) == ["a", "A", "b"] and fetched == [regenerated]
        answer(store, cid, regenerated, "B2")
        known = store.read_since(cid, known)
        store.switch(cid, second)
        fetched.clear()
        known = store.read_since(cid, known)
        assert texts(known) == ["a", "A", "b", "B", "B!"] and fetched == []  # both turns read before
        assert known == store.read(cid)
    finally:
        reads._fetch_turns = real


def test_a_reader_that_holds_a_path_is_sent_only_where_the_new_one_leaves_it(store, monkeypatch):
    """A switch at turn 30: the reader keeps the 29 turns above the fork and is sent the fork's turn and the one
    below it; a reader more than MAX_LOG tree versions behind reads the whole path again. Both agree with a read
    from nothing."""
    cid, turns = new_id(), []
    for n in range(30):
        turns.append(ask(store, cid, f"q{n}"))
        answer(store, cid, turns[-1], f"a{n}")
    regenerated = ask(store, cid, "q29", branch_of=turns[-1])
    answer(store, cid, regenerated, "a29 again")
    known = store.read(cid)
    forks = []
    real = reads._forked
    monkeypatch.setattr(reads, "_forked", lambda held, kept, below, changes: (
        forks.append((len(held), kept, [row[0] for row in below])), real(held, kept, below, changes))[1])
    store.switch(cid, turns[-1])
    known = store.read_since(cid, known)
    assert forks == [(30, 28, [turns[-2], turns[-1]])]  # the fork (turn 29, it may have changed) and turn 30
    assert known == store.read(cid) and texts(known)[-1] == "a29"
    far = known
    for _ in range(40):  # 80 tree versions: past MAX_LOG
        store.switch(cid, regenerated)
        store.switch(cid, turns[-1])
    forks.clear()
    again = store.read_since(cid, far)
    assert forks == [] and again == store.read(cid)


def test_delete_deletes_every_branch(store):
    cid = new_id()
    first = ask(store, cid, "a")
    answer(store, cid, first, "A")
    ask(store, cid, "b", branch_of=first)
    assert store.delete(cid)
    assert store.redis.exists(*Keys.of(cid).all) == 0 and store.read(cid) is None


def test_the_lists_row_follows_the_branch_shown_unless_renamed(store):
    from agent.conversation import listing

    cid = new_id()
    first = ask(store, cid, "first question")
    answer(store, cid, first, "A")
    second = ask(store, cid, "second question")
    answer(store, cid, second, "B")
    row = listing.info(store, cid)
    assert row.title == "first question" and row.turns == 2
    edited = ask(store, cid, "the first question, edited", branch_of=first)
    answer(store, cid, edited, "C")
    row = listing.info(store, cid)
    assert row.title == "the first question, edited" and row.turns == 1
    store.switch(cid, second)
    row = listing.info(store, cid)
    assert row.title == "first question" and row.turns == 2
    assert store.rename(cid, "Mine")
    store.switch(cid, edited)
    row = listing.info(store, cid)
    assert row.title == "Mine" and row.turns == 1


def test_random_sends_edits_regenerates_switches_and_deletes_read_back_as_a_plain_model_says(store):
    import random

    rng = random.Random(3907)
    for _ in range(4):
        cid, model, known, earlier = new_id(), Model(), None, []
        for step in range(60):
            op = rng.choice(["send", "send", "regenerate", "edit", "switch", "read"] if model.parent else ["send"])
            if op == "send":
                turn = ask(store, cid, f"message {step}")
                answer(store, cid, turn, f"answer {step}")
                model.add(turn, model.tip, f"message {step}", f"answer {step}")
            elif op in ("regenerate", "edit"):
                of = rng.choice(list(model.parent))
                text = model.message[of] if op == "regenerate" else f"edited {step}"
                turn = ask(store, cid, text, branch_of=of)
                answer(store, cid, turn, f"answer {step}")
                model.add(turn, model.parent[of], text, f"answer {step}")
            elif op == "switch":
                of = rng.choice(list(model.parent))
                model.switch(of)
                assert store.switch(cid, of) == model.tip
            # A reader that read a few changes ago (another tab, a page that slept): the path is read again only
            # below where it left the one held (read.lua's 'fork'), and agrees with a whole read.
            older = store.read_since(cid, rng.choice(earlier)) if earlier else None
            known = store.read_since(cid, known) if rng.random() < 0.7 else store.read(cid)
            earlier = [*earlier[-8:], known]
            path = model.path()
            for state in (known, store.read(cid), *([older] if older else [])):
                assert [m["content"] for m in state["history"]] == [
                    text for turn in path for text in (model.message[turn], model.answer[turn])]
                assert [t["turn_id"] for t in state["turns"]] == path and state["turn_id"] == path[-1]
                assert [t["parent_turn_id"] for t in state["turns"]] == [model.parent[t] or None for t in path]
                assert [t["siblings"] for t in state["turns"]] == [model.kids[model.parent[t]] for t in path]
                assert [s["turn_id"] for s in state["steps"]] == path
            tree = store.branches(cid)
            assert {t["turn_id"]: t["parent_turn_id"] for t in tree["turns"]} == {
                t: p or None for t, p in model.parent.items()}
            assert [t["turn_id"] for t in tree["turns"] if t["shown"]] == path
        assert store.delete(cid) and store.read(cid) is None


def test_a_persons_door_reads_and_switches_only_their_own_tree(store):
    from agent.conversation.errors import ConversationGone
    from agent.conversation.person_store import PersonStore

    alice, bob = PersonStore(store, "p" + "a" * 20), PersonStore(store, "p" + "b" * 20)
    cid = new_id()
    first = ask(alice, cid, "a")
    answer(alice, cid, first, "A")
    ask(alice, cid, "again", branch_of=first)
    answer(alice, cid, store.read(cid)["turn_id"], "A2")
    assert bob.branches(cid) is None and bob.turn_message(cid, first) is None
    with pytest.raises(ConversationGone):
        bob.switch(cid, first)
    with pytest.raises(ConversationGone):
        ask(bob, cid, "mine", branch_of=first)
    assert alice.switch(cid, first) == first and len(alice.branches(cid)["turns"]) == 2


def test_a_turn_begun_again_after_it_ended_leaves_the_tree_as_it_was(store):
    """A send submitted twice (the first long since answered) names a turn of the tree: nothing is written, the turn's
    record keeps its answer, and it is not its parent's child twice."""
    cid = new_id()
    first = ask(store, cid, "a")
    answer(store, cid, first, "A")
    second = ask(store, cid, "b")
    answer(store, cid, second, "B")
    before = store.read(cid)
    tree_before = store.redis.hgetall(Keys.of(cid).tree)
    for tid in (first, second):
        new, _ = store._begin(cid, tid, {"role": "user", "content": "again"}, DOC, ttl_s=600, must_exist=False)
        assert new is False
    assert store.redis.hgetall(Keys.of(cid).tree) == tree_before
    after = store.read(cid)
    assert texts(after) == ["a", "A", "b", "B"] and after["version"] == before["version"]
    assert after["siblings"] == [second] and after["turns"][0]["siblings"] == [first]


def test_a_persons_door_reads_the_path_to_any_turn_of_their_own_and_an_admin_reads_it_too(store):
    """What `export --all-branches --owner` reads: each branch, through the person's door (an admin's: read-only)."""
    from agent.conversation.person_store import PersonStore

    alice, bob = PersonStore(store, "p" + "c" * 20), PersonStore(store, "p" + "d" * 20)
    admin = PersonStore(store, "p" + "e" * 20, admin=True)
    cid = new_id()
    first = ask(alice, cid, "a")
    answer(alice, cid, first, "A")
    again = ask(alice, cid, "a", branch_of=first)
    answer(alice, cid, again, "A2")
    assert texts(alice.read(cid, tip=first)) == ["a", "A"] and texts(alice.read(cid)) == ["a", "A2"]
    assert texts(admin.read(cid, tip=first)) == ["a", "A"]
    assert bob.read(cid, tip=first) is None
