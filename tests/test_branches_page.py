"""Branches on the page, headless with AppTest against the session's real Redis: the picker ("‹ 2 / 3 ›") and
its switch, Regenerate and Edit (each a new turn beside the old one, through the queue's path), Cancel, the
refusal while a turn is in flight (the edited text stays in the editor), and the pure logic of the picker."""

from __future__ import annotations

import time

from agent.queue import new_id
from agent.ui import actions
from tests.apptest_page import app, texts
from tests.conftest import FAST
from tests.live_owner import keep_alive
from tests.test_app import app_env, assert_no_exception, begin, make_done

__all__ = ["app_env"]


def branch(store, cid: str, of: str, text: str, answer: str | None = None) -> str:
    """A turn beside `of` (its parent's child), answered with `answer` when given."""
    turn_id = new_id()
    doc = {"status": "queued", "error": None, "config": FAST.to_dict(), "job_id": f"turn-{turn_id}",
           "enqueued_at": time.time(), "deadline_at": None, "job_timeout_at": None, "started_at": None,
           "current_step": None}
    store.begin_turn(cid, turn_id, {"role": "user", "content": text}, doc, branch_of=of)
    if answer is not None:
        make_done(store, cid, turn_id, answer)
    return turn_id


def asked(state) -> list[str]:
    """The person's messages on the shown path. The turn a click queued may already be answered: a session's pool of
    workers (another test's, in this process) takes whatever reaches the queue."""
    return [m["content"] for m in state["history"] if m["role"] == "user"]


def three_branches(store) -> tuple[str, list[str]]:
    cid, first = begin(store, "What is 2+2?")
    make_done(store, cid, first, "answer one")
    second = branch(store, cid, first, "What is 2+2?", "answer two")
    third = branch(store, cid, first, "What is 3+3?", "answer three")
    return cid, [first, second, third]


def key_of(at, prefix: str) -> str:
    keys = [b.key for b in at.button if (b.key or "").startswith(prefix)]
    assert keys, f"no button {prefix}…: {[b.key for b in at.button]}"
    return keys[-1]


def test_the_picker_says_where_the_turn_is_and_flips_between_three_branches(store):
    cid, turns = three_branches(store)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    page = texts(at)
    assert "3 / 3" in page and "answer three" in page and "answer one" not in page
    at.button(key=key_of(at, "branch-before-")).click().run()
    assert store.read(cid)["turn_id"] == turns[1]
    page = texts(at)
    assert "2 / 3" in page and "answer two" in page and "answer three" not in page
    at.button(key=key_of(at, "branch-before-")).click().run()
    assert store.read(cid)["turn_id"] == turns[0]
    assert "1 / 3" in texts(at) and at.button(key=key_of(at, "branch-before-")).disabled
    at.button(key=key_of(at, "branch-after-")).click().run()
    assert store.read(cid)["turn_id"] == turns[1] and "answer two" in texts(at)


def test_regenerate_starts_a_new_turn_with_the_same_message_beside_the_old_one(store, queue):
    cid, first = begin(store, "What is 17*23?")
    make_done(store, cid, first, "391")
    at = app(cid)
    at.run()
    at.button(key=key_of(at, "regenerate-")).click().run()
    assert_no_exception(at)
    state = store.read(cid)
    assert state["turn_id"] != first and state["siblings"] == [first, state["turn_id"]]
    assert asked(state) == ["What is 17*23?"]
    assert state["branch"] == {"of": first, "kind": "regenerate"}
    queue.empty()


def test_edit_opens_an_editor_with_the_message_and_sends_a_new_branch_cancel_changes_nothing(store, queue):
    cid, first = begin(store, "What is 17*23?")
    make_done(store, cid, first, "391")
    at = app(cid)
    at.run()
    at.button(key=key_of(at, "edit-")).click().run()
    assert at.text_area(key=actions.EDIT_TEXT_KEY).value == "What is 17*23?"
    at.button(key=key_of(at, "edit-cancel-")).click().run()
    assert not at.text_area and store.read(cid)["turn_id"] == first
    at.button(key=key_of(at, "edit-")).click().run()
    at.text_area(key=actions.EDIT_TEXT_KEY).set_value("What is 17*24?")
    at.button(key=key_of(at, "edit-send-")).click().run()
    assert_no_exception(at)
    state = store.read(cid)
    assert state["siblings"] == [first, state["turn_id"]] and state["parent_turn_id"] is None
    assert asked(state) == ["What is 17*24?"]
    assert state["branch"] == {"of": first, "kind": "edit"}
    assert not at.text_area  # the editor closed with the send
    queue.empty()


def test_an_edit_while_a_turn_is_in_flight_is_refused_with_stop_first_and_the_text_stays(store, queue):
    cid, first = begin(store, "What is 17*23?")
    make_done(store, cid, first, "391")
    second, _ = begin(store, "And 2+2?", cid=cid)[1], None
    keep_alive(store, cid)
    at = app(cid)
    at.run()
    at.button(key=key_of(at, "edit-")).click().run()
    at.text_area(key=actions.EDIT_TEXT_KEY).set_value("What is 17*25?")
    at.button(key=key_of(at, "edit-send-")).click().run()
    assert_no_exception(at)
    page = texts(at)
    assert "Stop it first" in page, page[-1500:]
    assert at.text_area(key=actions.EDIT_TEXT_KEY).value == "What is 17*25?"
    assert store.read(cid)["turn_id"] == second and store.branches(cid) is not None
    queue.empty()


def test_picker_positions():
    assert actions.picker(["a", "b", "c"], "b") == (2, 3, "a", "c")
    assert actions.picker(["a", "b", "c"], "a") == (1, 3, None, "b")
    assert actions.picker(["a", "b", "c"], "c") == (3, 3, "b", None)
    assert actions.picker(["a"], "zz") == (1, 1, None, None)


def test_every_action_sits_under_the_persons_message_or_the_answer_and_has_its_own_key():
    keys = [a.key for a in actions.ACTIONS]
    assert len(set(keys)) == len(keys)
    assert {a.role for a in actions.ACTIONS} <= {"user", "assistant"}


def test_a_regenerate_in_flight_leaves_its_parent_compact_as_a_new_message_leaves_the_last_turn_in_full(store):
    """Drawn in full, the parent's steps and chart would reach the browser just before the new answer's words."""
    cid, first = begin(store, "What is 2+2?")
    make_done(store, cid, first, "4")
    second = begin(store, "And 3+3?", cid=cid)[1]
    make_done(store, cid, second, "6")
    branch(store, cid, second, "And 3+3?")  # a regenerate of the second turn, in flight
    keep_alive(store, cid)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    toggles = {t.key for t in at.toggle}
    assert f"details-0-{first}" in toggles, toggles  # compact: its steps behind a toggle
    other = new_id()
    cid2, first2 = begin(store, "What is 2+2?", cid=other)
    make_done(store, cid2, first2, "4")
    begin(store, "And 3+3?", cid=cid2)  # a new message, in flight
    keep_alive(store, cid2)
    at2 = app(cid2)
    at2.run()
    assert f"details-0-{first2}" not in {t.key for t in at2.toggle}  # the last finished turn, in full


def test_regenerate_an_earlier_answer_starts_its_branch_there_and_the_later_turns_stay_on_the_old_one(store, queue):
    cid, first = begin(store, "What is 2+2?")
    make_done(store, cid, first, "4")
    second = begin(store, "And 3+3?", cid=cid)[1]
    make_done(store, cid, second, "6")
    at = app(cid)
    at.run()
    at.button(key=f"regenerate-0-{first}").click().run()
    assert_no_exception(at)
    state = store.read(cid)
    assert state["siblings"] == [first, state["turn_id"]] and state["parent_turn_id"] is None
    assert asked(state) == ["What is 2+2?"]
    tree = {t["turn_id"]: t for t in store.branches(cid)["turns"]}
    assert tree[second]["parent_turn_id"] == first  # the old branch, whole
    queue.empty()


def test_a_turn_in_flight_beside_its_siblings_says_where_it_sits_without_arrows(store):
    """"‹ 2 / 2 ›" from the first moment of a regenerate, its arrows only once it ends: the shown branch cannot
    change under a turn being written."""
    cid, first = begin(store, "What is 2+2?")
    make_done(store, cid, first, "4")
    second = branch(store, cid, first, "What is 2+2?")  # a regenerate, in flight
    keep_alive(store, cid)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    assert "‹ **2 / 2** ›" in [c.value for c in at.caption]
    assert not [b.key for b in at.button if (b.key or "").startswith("branch-")]
    make_done(store, cid, second, "four")
    at.run()
    assert_no_exception(at)
    assert "2 / 2" in texts(at) and not at.button(key=key_of(at, "branch-before-")).disabled
