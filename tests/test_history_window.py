"""What a model call is sent of a long conversation: the latest turns, under a byte cap; the stored
history is never cut. A seeded fuzz of large messages and tool results, then one real turn."""

from __future__ import annotations

import random

import pytest

from agent.contract import Role
from agent.queue import submit_turn
from agent.turn.history_window import latest_turns, message_bytes
from tests.conftest import FAST, wait_done
from tests.scripted_server import chat_reply


def _turn(rng: random.Random, index: int) -> list[dict]:
    messages = [{"role": Role.USER, "content": f"question {index} " + "q" * rng.randint(0, 8000)}]
    for call in range(rng.randint(0, 3)):
        call_id = f"c{index}-{call}"
        messages.append({"role": Role.ASSISTANT, "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]})
        messages.append({"role": Role.TOOL, "tool_call_id": call_id, "content": "r" * rng.randint(0, 300_000)})
    messages.append({"role": Role.ASSISTANT, "content": "a" * rng.randint(0, 50_000)})
    return messages


def test_a_fuzz_of_large_turns_is_sent_under_the_cap_from_the_latest_whole_turns():
    rng = random.Random(2026)
    for _ in range(300):
        turns = [_turn(rng, i) for i in range(rng.randint(1, 12))]
        history = [m for turn in turns for m in turn]
        cap = rng.choice([1_000, 50_000, 300_000, 1_000_000, 10_000_000])
        before = [dict(m) for m in history]
        sent, not_sent = latest_turns(history, cap)
        assert history == before  # what is stored is never cut
        kept = turns[not_sent:]
        assert sent == [m for turn in kept for m in turn]  # whole turns, the latest ones, in order
        size = sum(map(message_bytes, sent))
        assert size <= cap or not_sent == len(turns) - 1  # over the cap only with the current turn alone
        if not_sent:  # no more was left out than needed
            assert size + sum(map(message_bytes, turns[not_sent - 1])) > cap
        ids = {m["tool_call_id"] for m in sent if m["role"] == Role.TOOL}
        calls = {c["id"] for m in sent for c in m.get("tool_calls") or []}
        assert ids == calls  # no result without its call, no call without its result


@pytest.mark.usefixtures("pool")
def test_a_turn_on_a_long_conversation_sends_its_latest_turns_and_its_step_says_so(store, queue, scripted):
    scripted.add(*(chat_reply(f"answer {i} " + "x" * 20_000) for i in range(4)))
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                               max_history_sent_bytes=30_000)
    cid = None
    for i in range(4):
        cid = cid or f"long-{random.Random().getrandbits(40):x}"
        submit_turn(store, queue, cid, f"question {i}", config)
        wait_done(store, cid)
    sent = scripted.wait_for_requests(4)[-1].json["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["question 2", "question 3"]
    state = store.read(cid)
    assert len([m for m in state["history"] if m["role"] == "user"]) == 4  # all stored
    last_model_step = [s for s in state["steps"] if s["kind"] == "model"][-1]
    assert last_model_step["turns_not_sent"] == 2
