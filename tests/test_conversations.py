"""Conversations that last, on a real Redis: the index kept by every write, listing at a flat cost,
expiry of the index entry with the state, rename, delete, the size cap, the memory limit, export."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from agent.contract import Role
from agent.conversation import export
from agent.conversation import listing as conversations
from agent.conversation.errors import ConversationFull, ConversationGone, StoreError, StoreFull
from agent.conversation.keys import INDEX_KEY, Keys
from agent.conversation.listing import list_conversations, sweep_expired
from agent.conversation.store import Store
from agent.conversation.writes import TITLE_CHARS, make_title
from agent.queue import new_id
from harness.waiting import wait_for

DOC = {"status": "queued", "error": None, "job_id": "j", "enqueued_at": 0.0}


def begin(store: Store, text: str = "What is 6*6?", cid: str | None = None, **kwargs) -> tuple[str, str]:
    cid, tid = cid or new_id(), new_id()
    store.begin_turn(cid, tid, {"role": Role.USER, "content": text}, DOC, **kwargs)
    return cid, tid


def finish(store: Store, cid: str, tid: str, answer: str = "36") -> None:
    store.publish(cid, tid, {**DOC, "status": "done"}, done=True,
                  new_messages=[{"role": Role.ASSISTANT, "content": answer}],
                  summary={"turn_id": tid, "status": "done", "error": None, "ended_at": time.time()})


def test_every_write_keeps_the_index_most_recent_first_with_title_turns_and_in_flight(private_redis):
    store = private_redis.store
    older, t1 = begin(store, "What is 17*23?")
    newer, t2 = begin(store, "What time is it in Tokyo?")
    rows = list_conversations(store).conversations
    assert [r.conversation_id for r in rows] == [newer, older]
    assert rows[0].in_flight and rows[0].turns == 1 and rows[0].title == "What time is it in Tokyo?"
    finish(store, older, t1)  # a write moves it to the top and ends its flight
    _, t3 = begin(store, "and 18*23?", cid=older)
    rows = list_conversations(store).conversations
    assert [r.conversation_id for r in rows] == [older, newer]
    assert rows[0].turns == 2 and rows[0].title == "What is 17*23?"  # the first message stays the title
    assert rows[0].updated_at == store.redis.zscore(INDEX_KEY, older)


def test_a_conversation_that_expires_leaves_the_index_too(private_redis):
    store = Store(private_redis.client, ttl_s=1)
    cid, tid = begin(store)
    finish(store, cid, tid)
    assert store.redis.zscore(INDEX_KEY, cid) is not None
    wait_for(lambda: store.read(cid) is None, 10, "the state expired")
    assert cid not in [r.conversation_id for r in list_conversations(store).conversations]
    assert store.redis.zscore(INDEX_KEY, cid) is None


def test_the_sweep_drops_expired_entries_beyond_the_page_a_listing_reads(private_redis):
    store = Store(private_redis.client, ttl_s=1)
    expired = []
    for _ in range(5):
        cid, tid = begin(store)
        finish(store, cid, tid)
        expired.append(cid)
    wait_for(lambda: all(store.read(c) is None for c in expired), 10, "the states expired")
    live = Store(private_redis.client, ttl_s=600)
    kept, _ = begin(live)
    # A listing of one row reads only the newest entry; the sweep finds the old ones by score.
    assert sweep_expired(store) == 5
    assert [m.decode() for m in store.redis.zrange(INDEX_KEY, 0, -1)] == [kept]


def test_an_entry_older_than_the_ttl_whose_state_lives_on_is_not_swept(private_redis):
    # A turn waiting in the queue keeps a longer TTL than the store's: its entry must stay.
    store = Store(private_redis.client, ttl_s=1)
    cid, _ = begin(store, ttl_s=600)
    assert sweep_expired(store, now=time.time() + 10) == 0
    assert store.redis.zscore(INDEX_KEY, cid) is not None


def _listing_cost(store: Store, repeats: int = 15) -> tuple[int, float]:
    """Redis commands one listing issues, and its best Python CPU time of `repeats`."""
    store.redis.config_resetstat()
    list_conversations(store, limit=10)
    calls = sum(v["calls"] for k, v in store.redis.info("commandstats").items() if not k.endswith("info"))
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        list_conversations(store, limit=10)
        best = min(best, time.thread_time() - started)
    return calls, best


def test_listing_10000_conversations_costs_the_same_as_listing_10(private_redis):
    store = private_redis.store
    for _ in range(10):
        finish(store, *begin(store))
    calls_10, cpu_10 = _listing_cost(store)
    for _ in range(10_000 - 10):
        finish(store, *begin(store))
    assert store.redis.zcard(INDEX_KEY) == 10_000
    calls_10k, cpu_10k = _listing_cost(store)
    # The same commands (a page of the index and the rows shown), and no more CPU than a margin's worth.
    assert calls_10k == calls_10, (calls_10, calls_10k)
    assert cpu_10k < cpu_10 * 2 + 0.005, (cpu_10, cpu_10k)
    print(f"a page of 10 rows with 10 conversations: {cpu_10 * 1000:.2f} ms CPU, with 10,000: "
          f"{cpu_10k * 1000:.2f} ms CPU, {calls_10k} Redis commands each")


def test_a_filter_finds_titles_by_any_case_and_says_when_it_looked_no_further(private_redis, monkeypatch):
    store = private_redis.store
    wanted, _ = begin(store, "Tokyo weather, please")
    for _ in range(30):
        begin(store, "something else")
    found = list_conversations(store, text="TOKYO")
    assert [r.conversation_id for r in found.conversations] == [wanted] and found.searched_all
    monkeypatch.setattr(conversations, "FILTER_HORIZON", 10)
    monkeypatch.setattr(conversations, "_BATCH", 10)
    bounded = list_conversations(store, text="tokyo")
    assert bounded.conversations == [] and not bounded.searched_all


def test_rename_changes_the_title_cleaned_and_never_creates_a_conversation(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    version = store.version(cid)
    assert store.rename(cid, "  Sums\nand\x1b[31m times  ")
    assert conversations.info(store, cid).title == "Sums and [31m times"
    assert store.version(cid) == version  # not a write of the state: no tab redraws for it
    assert not store.rename("no-such-one", "x")
    assert store.redis.exists(Keys.of("no-such-one").meta) == 0


def test_delete_removes_every_key_and_the_entry_and_a_later_send_says_it_was_deleted(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    finish(store, cid, tid)
    assert store.delete(cid)
    assert store.redis.exists(*Keys.of(cid).all) == 0
    assert store.redis.zscore(INDEX_KEY, cid) is None
    with pytest.raises(ConversationGone) as gone:
        begin(store, "What is 7*7?", cid=cid, must_exist=True)
    assert gone.value.deleted and "deleted" in str(gone.value)
    assert store.read(cid) is None  # not started afresh under the same id


def test_a_send_to_a_conversation_that_expired_is_refused_not_started_afresh(private_redis):
    store = Store(private_redis.client, ttl_s=1)
    cid, tid = begin(store)
    finish(store, cid, tid)
    wait_for(lambda: store.read(cid) is None, 10, "the state expired")
    with pytest.raises(ConversationGone) as gone:
        begin(store, "What is 6*6?", cid=cid, must_exist=True)
    assert not gone.value.deleted and "expired" in str(gone.value)
    assert store.read(cid) is None


def test_deleting_a_turn_in_flight_asks_it_to_stop_and_refuses_its_later_writes(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    store.delete(cid)
    assert store.cancel_requested(tid)
    with pytest.raises(StoreError) as refused:
        store.publish(cid, tid, {**DOC, "status": "running"}, new_messages=[{"role": "assistant", "content": "x"}])
    assert refused.value.reason == "GONE"
    assert store.redis.exists(*Keys.of(cid).all) == 0 and store.redis.zscore(INDEX_KEY, cid) is None


TITLE_SAMPLES = [
    "**bold** _it_ [link](http://example.test) ![img](http://canary.test/x.png) # heading",
    "<script>alert(1)</script><img src=x onerror=alert(1)>",
    "x" * 10_240,
    "bell\x07 esc\x1b[2J nul\x00 del\x7f tab\t new\nline \u202eevil\u202c",
    "مرحبا كيف حالك؟ שלום עולם",
]


@pytest.mark.parametrize("text", TITLE_SAMPLES, ids=["markdown", "html", "10kb", "control", "rtl"])
def test_a_title_is_one_printable_line_cut_to_its_length(private_redis, text):
    title = make_title(text)
    assert len(title) <= TITLE_CHARS and title.isprintable() and "\n" not in title
    store = private_redis.store
    cid, _ = begin(store, text[:8000])
    assert conversations.info(store, cid).title == make_title(text[:8000])


def _stored_bytes(store: Store, cid: str) -> int:
    """What the conversation's turns hold: their messages, steps and summaries (the tree's other fields are
    its shape: ids and counts)."""
    tree = store.redis.hgetall(Keys.of(cid).tree)
    return sum(len(value) for field, value in tree.items()
               if b":m:" in field or b":s:" in field or field.endswith(b":sum"))


def test_a_fuzz_of_large_messages_and_tool_results_never_passes_the_cap_by_more_than_a_turn(private_redis):
    rng = random.Random(1414)
    cap = 2_000_000
    store = Store(private_redis.client, ttl_s=600, max_conversation_bytes=cap)
    for _ in range(12):
        cid, refused, largest_turn = new_id(), False, 0
        for _ in range(40):
            try:
                _, tid = begin(store, "q" * rng.randint(1, 8000), cid=cid)
            except ConversationFull as exc:
                refused = True
                assert "new chat" in str(exc) and "download" in str(exc)
                break
            before = _stored_bytes(store, cid)
            big = [{"role": Role.TOOL, "tool_call_id": "c", "content": "r" * rng.randint(0, 400_000)}
                   for _ in range(rng.randint(0, 3))]
            store.publish(cid, tid, {**DOC, "status": "running"}, new_messages=big,
                          new_steps=[{"turn_id": tid, "index": 1, "result": "s" * rng.randint(0, 20_000)}])
            finish(store, cid, tid, answer="a" * rng.randint(0, 200_000))
            largest_turn = max(largest_turn, _stored_bytes(store, cid) - before)
        stored = _stored_bytes(store, cid)
        assert int(store.redis.hget(Keys.of(cid).meta, "bytes")) == stored  # the counter is exact
        assert refused and cap <= stored < cap + largest_turn + 8000


def test_near_the_memory_limit_new_turns_are_refused_and_the_turn_in_flight_still_ends(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    used = int(store.redis.info("memory")["used_memory"])
    store.redis.config_set("maxmemory", str(int(used / 0.92)))  # past 90% of the limit already
    store.redis.config_set("maxmemory-policy", "noeviction")
    try:
        store.room.forget()
        with pytest.raises(StoreFull) as full:
            begin(store, "another question")
        assert "full" in str(full.value) and "nothing was sent" in str(full.value)
        finish(store, cid, tid)  # the headroom above 90% is for this
        assert store.read(cid)["done"]
    finally:
        store.redis.config_set("maxmemory", "0")


def test_a_json_export_is_the_stored_state_and_markdown_has_every_message(private_redis):
    rng = random.Random(77)
    store = private_redis.store
    cid, tid = begin(store, "What is 17*23? ``` not a fence")
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'}}
    contents = ["`" * rng.randint(3, 9) + " tool output " + "".join(rng.choice("<>*_`#!\n[]()") for _ in range(200))
                for _ in range(3)]
    store.publish(cid, tid, {**DOC, "status": "running"},
                  new_messages=[{"role": Role.ASSISTANT, "content": None, "tool_calls": [call]},
                                *({"role": Role.TOOL, "tool_call_id": "c1", "content": c} for c in contents)],
                  new_steps=[{"turn_id": tid, "index": 1, "kind": "tool", "started_at": 1.0, "ended_at": 2.0}])
    finish(store, cid, tid, answer="17*23 = **391**\nsecond line")
    state = store.read(cid)
    assert json.loads(export.to_json(state)) == state
    markdown = export.to_markdown(state, "Sums")
    for message in state["history"]:
        for line in (message.get("content") or "").split("\n"):
            assert line in markdown
    # The call's arguments as the tool receives them (decoded, one key a line: agent/text/visible.py).
    assert '"expression": "17*23"' in markdown and "Ending: answered" in markdown
    for content in contents:  # each tool result sits inside a fence that no backtick run in it can close
        fence = markdown[:markdown.index(content)].rstrip("\n").rsplit("\n", 1)[-1]
        assert set(fence) == {"`"} and len(fence) > max(map(len, re.findall("`+", content)))


def test_a_markdown_export_makes_images_and_odd_links_inert_as_the_page_does(private_redis):
    store = private_redis.store
    cid, tid = begin(store, "show me ![u](http://canary.test/u.png)")
    finish(store, cid, tid, answer="![x](http://canary.test/x.png) [run](javascript:alert(1)) [ok](https://example.org)")
    markdown = export.to_markdown(store.read(cid))
    assert "](http://canary.test" not in markdown and "](javascript:" not in markdown
    assert "image not shown: x" in markdown and "[ok](https://example.org)" in markdown
    assert "![x](http://canary.test/x.png)" in export.to_json(store.read(cid))  # the data stays as stored


def test_a_message_past_the_size_cap_is_refused_on_the_page_with_its_text_kept(redis_client, queue):
    from agent.ui import state as ui
    from tests.conftest import FAST

    store = Store(redis_client, ttl_s=600, max_conversation_bytes=100)
    cid, tid = begin(store, "q" * 200)
    finish(store, cid, tid)
    session = {ui.VIEW_KEY: {"cid": cid, "version": store.version(cid), "state": store.read(cid)}}
    assert ui.send(store, queue, session, cid, "and one more question", FAST) is None
    kind, text, unsent = session[ui.FLASH_KEY]
    assert "start a new chat" in text and "download" in text and unsent == "and one more question"
    assert len(store.read(cid)["history"]) == 2  # nothing was added


def test_a_full_redis_can_still_be_read_and_a_conversation_deleted_to_make_room(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    finish(store, cid, tid)
    before = store.read(cid)
    store.redis.config_set("maxmemory-policy", "noeviction")
    store.redis.config_set("maxmemory", "1")  # every write that needs memory is refused
    try:
        assert store.read(cid) == before and store.read_since(cid, {**before, "history": before["history"][:1]})
        assert list_conversations(store).conversations[0].conversation_id == cid
        assert store.delete(cid)
        assert store.read(cid) is None and store.redis.zscore(INDEX_KEY, cid) is None
    finally:
        store.redis.config_set("maxmemory", "0")
