"""The page's conversations, headless with AppTest against the session's real Redis (and real workers
where a turn runs): the sidebar list, open, rename, delete, download, and a tab whose conversation
expired or was deleted, which says so and keeps what was not sent."""

from __future__ import annotations

import pytest

from agent.conversation.export import to_json
from agent.conversation.keys import INDEX_KEY, Keys
from agent.conversation.listing import info
from agent.queue import job_status, new_id, submit_turn
from agent.ui import conversations as conversations_ui
from harness.waiting import wait_for
from tests.apptest_page import app, texts, walk
from tests.conftest import FAST
from tests.live_owner import keep_alive
from tests.test_app import app_env, assert_no_exception, autorefresh_present, begin, make_done

__all__ = ["app_env"]  # the app's environment, for every test here


def done_conversation(store, question: str = "What is 17*23?", answer: str = "17*23 = 391") -> str:
    cid, turn_id = begin(store, question)
    make_done(store, cid, turn_id, answer)
    return cid


def sidebar_rows(at) -> dict[str, object]:
    return {b.key[len("conv-"):]: b for b in at.sidebar.button if (b.key or "").startswith("conv-")}


def test_the_sidebar_lists_conversations_most_recent_first_with_the_current_one_highlighted(store):
    older = done_conversation(store, "What is 2+2?", "4")
    newer = done_conversation(store, "What time is it in Tokyo?", "It is noon.")
    at = app(older)
    at.run()
    assert_no_exception(at)
    rows = sidebar_rows(at)
    keys = list(rows)
    assert keys.index(newer) < keys.index(older)
    assert rows[older].proto.type == "primary" and rows[newer].proto.type == "secondary"
    assert "What time is it in Tokyo?" in rows[newer].label and "1 turn" in rows[newer].label


def test_a_conversation_opened_from_the_list_shows_under_its_own_link(store):
    first = done_conversation(store, "What is 2+2?", "2+2 = 4")
    second = done_conversation(store, "What is 3+3?", "3+3 = 6")
    at = app(first)
    at.run()
    at.button(key=f"conv-{second}").click().run()
    assert_no_exception(at)
    assert at.query_params["c"] == second
    assert "3+3 = 6" in texts(at) and "2+2 = 4" not in texts(at)


def test_a_turn_in_flight_is_marked_in_the_list(store):
    cid, _ = begin(store, "still thinking")
    keep_alive(store, cid)
    at = app()
    at.run()
    assert sidebar_rows(at)[cid].label.startswith(conversations_ui.IN_FLIGHT_MARK)


def test_rename_gives_the_conversation_a_new_title_in_the_list(store):
    cid = done_conversation(store)
    at = app(cid)
    at.run()
    at.text_input(key=conversations_ui.RENAME_KEY).set_value("Arithmetic, **mostly**").run()
    at.button(key="rename").click().run()
    assert_no_exception(at)
    assert info(store, cid).title == "Arithmetic, **mostly**"
    assert "Arithmetic, \\*\\*mostly\\*\\*" in sidebar_rows(at)[cid].label  # shown as typed, not as bold


def test_delete_asks_for_a_confirmation_then_deletes_and_starts_a_new_chat(store):
    cid = done_conversation(store)
    at = app(cid)
    at.run()
    at.button(key="delete").click().run()
    assert store.read(cid) is not None  # not yet: a confirmation first
    assert any("Delete this conversation" in w.value for w in at.warning)
    at.button(key="delete-no").click().run()
    assert store.read(cid) is not None and not at.button(key="delete").disabled
    at.button(key="delete").click().run()
    at.button(key="delete-yes").click().run()
    assert_no_exception(at)
    assert store.read(cid) is None and store.redis.zscore(INDEX_KEY, cid) is None
    assert "c" not in at.query_params
    assert cid not in sidebar_rows(at)
    # Said on the page, not only in a toast that a rerun can drop: it stays until dismissed.
    said = "The conversation was deleted. This is a new chat."
    assert said in [i.value for i in at.info]
    at.run()
    assert said in [i.value for i in at.info]
    at.button(key="dismiss-flash").click().run()
    assert said not in [i.value for i in at.info]


def test_deleting_a_conversation_in_flight_in_another_tab_ends_its_turn_cleanly_and_the_tab_says_so(
        store, queue, pool):
    cid = new_id()
    # The `wait` tool for 30 s, on clocks that leave it 15 s: in flight for as long as the test needs.
    submit_turn(store, queue, cid, "Please be slow 30 seconds.",
                FAST.with_changes(model="demo:slow-tool", job_timeout_s=20, deadline_margin_s=5.0))
    meta = wait_for(lambda: (m := store.read_meta(cid)) and (m["current_step"] or {}).get("kind") == "tool" and m, 30,
                    "the turn runs its tool")
    watching, deleting = app(cid), app(cid)
    watching.run()
    assert autorefresh_present(watching)
    deleting.run()
    deleting.button(key="delete").click().run()
    assert any("reply in flight is stopped" in w.value for w in deleting.warning)
    deleting.button(key="delete-yes").click().run()
    watching.run()  # its next poll
    assert_no_exception(watching)
    assert "was deleted" in texts(watching)
    assert [t.value for t in watching.toast] == ["That conversation was deleted: this is a new chat."]
    assert not autorefresh_present(watching) and not watching.chat_input[0].disabled
    assert "c" not in watching.query_params
    # The worker's turn stops and ends without writing the conversation back.
    wait_for(lambda: job_status(queue.connection, meta["job_id"]) in ("finished", "failed", None), 20, "the job ended")
    assert job_status(queue.connection, meta["job_id"]) in ("finished", None)
    assert store.redis.exists(*Keys.of(cid).all) == 0


def test_an_open_tab_whose_conversation_expired_says_so_when_it_sends_and_keeps_the_text(store, queue):
    cid = done_conversation(store)
    at = app(cid)
    at.run()
    for key in Keys.of(cid).all:  # Redis expires them, as it would after the TTL
        store.redis.expire(key, 1)
    wait_for(lambda: store.read(cid) is None, 10, "the conversation expired")
    at.chat_input[0].set_value("What is 6*6?").run()
    assert_no_exception(at)
    page = texts(at)
    assert "has expired" in page and "this is a new chat" in page
    assert "What is 6*6?" in [c.value for c in at.code]  # the unsent text, on screen
    assert store.read(cid) is None  # not started afresh under the old link
    assert "c" not in at.query_params


def test_an_open_tab_whose_conversation_expired_says_so_on_its_next_run(store):
    cid = done_conversation(store)
    at = app(cid)
    at.run()
    for key in Keys.of(cid).all:
        store.redis.expire(key, 1)
    wait_for(lambda: store.read(cid) is None, 10, "the conversation expired")
    at.run()
    assert "The conversation this tab was showing has expired" in texts(at)


def test_a_link_to_a_deleted_conversation_says_it_was_deleted(store):
    cid = done_conversation(store)
    store.delete(cid)
    at = app(cid)
    at.run()
    assert "was deleted" in texts(at) and "c" not in at.query_params


def test_the_list_can_be_hidden_for_a_shared_page_and_this_conversation_keeps_its_controls(store, monkeypatch):
    cid = done_conversation(store)
    monkeypatch.setenv("AGENT_SHOW_CONVERSATIONS", "0")
    at = app(cid)
    at.run()
    assert_no_exception(at)
    assert sidebar_rows(at) == {}
    assert at.button(key="delete") is not None


@pytest.mark.parametrize("title", [
    "![x](http://canary.test/x.png) <img src=x onerror=alert(1)> [a](javascript:alert(1))",
    "# heading\n---\n* item",
    "x" * 10_240,
    "\x1b[2J\x07 bell \u202eevil",
    "مرحبا كيف حالك؟ שלום",
])
def test_a_title_is_shown_inert_and_cut(store, title):
    cid, _ = begin(store, title[:8000])
    at = app(cid)
    at.run()
    assert_no_exception(at)
    label = sidebar_rows(at)[cid].label
    assert label == conversations_ui.row_label(info(store, cid))
    shown = label.split(" · ")[0].removeprefix(conversations_ui.IN_FLIGHT_MARK + " ")
    assert len(shown.replace("\\", "")) <= 80 and "\n" not in label and "\x1b" not in label
    for special in "![]()<>#*":
        assert shown.count(special) == shown.count("\\" + special)  # every one escaped


def test_both_downloads_are_offered_and_hold_the_conversation(store):
    cid = done_conversation(store, "What is 17*23?", "17*23 = **391**")
    at = app(cid)
    at.run()
    kinds = [getattr(node, "type", "") for node in walk(at._tree)]
    assert kinds.count("download_button") == 2
    assert conversations_ui._export(store, cid, "json") == to_json(store.read(cid))
    markdown = conversations_ui._export(store, cid, "md")
    assert "What is 17*23?" in markdown and "17*23 = **391**" in markdown


def test_opening_another_conversation_keeps_a_message_that_was_not_sent(store):
    first, second = done_conversation(store), done_conversation(store, "What is 3+3?", "3+3 = 6")
    at = app(first)
    at.run()
    at.session_state["agent_flash"] = ("warning", "Not sent: this conversation has expired.", "my long question")
    at.button(key=f"conv-{second}").click().run()
    assert at.query_params["c"] == second
    assert "my long question" in [c.value for c in at.code]


@pytest.mark.parametrize("how", ["deleted", "never there", "unreadable"])
def test_the_toast_on_a_conversation_that_is_gone_says_what_its_notice_says(store, how):
    """A regression: a tab said "deleted" on the page and "not found" in the toast."""
    cid = done_conversation(store)
    if how == "deleted":
        store.delete(cid)
    elif how == "never there":
        cid = new_id()
    else:
        store.redis.hset(Keys.of(cid).meta, "version", "not a number")
    at = app(cid)
    at.run()
    assert_no_exception(at)
    (toast,) = [t.value for t in at.toast]
    gone = toast.removeprefix("That conversation ").split(":", 1)[0]
    assert gone == {"deleted": "was deleted", "never there": "was not found", "unreadable": "cannot be read"}[how]
    assert gone in " ".join(i.value for i in at.info), "the notice on the page says the same"
