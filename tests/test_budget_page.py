"""The fourth clock on the page: the money bar beside the time bar, each call's cost, the turn's and the
conversation's, the sidebar's budget, and a daily budget's refusal."""

from __future__ import annotations

import time

from agent.contract import turn_summary
from agent.spend import Spend
from tests.apptest_page import app, texts
from tests.conftest import FAST
from tests.live_owner import keep_alive
from tests.test_app import app_env, assert_no_exception, begin, make_running, running_doc, step  # noqa: F401

BUDGETED = FAST.with_changes(budget_usd=0.02)


def spend_doc(spent_tokens: int, spent_pusd: int, *, flying: tuple[int, int] = (0, 0)) -> dict:
    spend = Spend(budget_pusd=20_000_000_000, price=Spend.for_turn(BUDGETED).price)
    spend.spent_tokens, spend.spent_pusd = spent_tokens, spent_pusd
    spend.reserve_tokens, spend.reserve_pusd = 1500, 4_000_000_000
    doc = spend.to_doc()
    doc.update(budget_usd=0.02, in_flight_tokens=flying[0], in_flight_pusd=flying[1])
    return doc


def test_the_money_bar_shows_spent_left_and_kept_for_the_answer_beside_the_time_bar(store):
    cid, turn_id = begin(store, config=BUDGETED.to_dict())
    make_running(store, cid, turn_id)
    doc = running_doc(store, cid)
    doc["spend"] = spend_doc(1200, 3_000_000_000, flying=(900, 2_000_000_000))
    store.publish(cid, turn_id, doc)
    keep_alive(store, cid)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    bars = [bar.proto.text for bar in at.progress]
    assert len(bars) == 2 and bars[0].startswith("⏱️"), bars
    money = bars[1]
    assert money.startswith("💵 $0.0030 (1,200 tokens) spent · the call in flight: $0.0020 at most"), money
    assert "$0.0150 left" in money and "$0.0040 of it kept for the answer" in money
    assert at.progress[1].proto.value == 25  # ($0.003 + $0.002) of $0.02


def test_each_call_says_its_cost_and_max_tokens_and_each_turn_and_the_conversation_what_they_cost(store):
    cid = None
    for answer in ("first", "second"):
        cid, turn_id = begin(store, config=BUDGETED.to_dict(), cid=cid)
        doc = running_doc(store, cid)
        doc.update(status="done", current_step=None, ended_at=time.time(), spend=spend_doc(2000, 5_000_000_000))
        store.publish(cid, turn_id, doc, done=True, new_messages=[{"role": "assistant", "content": answer}],
                      new_steps=[step(turn_id, 1, "model", "demo", doc["started_at"], attempt=1, max_tokens=713,
                                      cost_tokens=2000, cost_usd=0.005, input_bound=2444,
                                      usage={"input_tokens": 1900, "output_tokens": 100})],
                      summary=turn_summary(turn_id, doc, doc["ended_at"]))
    at = app(cid)
    at.run()
    assert_no_exception(at)
    page = texts(at)
    assert "Cost: $0.0050, max_tokens 713." in page
    assert "💵 This turn cost $0.0050 (2,000 tokens) of a $0.0200 budget." in page
    assert "💵 This conversation so far: $0.0100 (4,000 tokens) over 2 turns." in page


def test_the_sidebar_says_the_next_turns_budget_and_the_models_price(store):
    at = app()
    at.run()
    assert_no_exception(at)
    page = texts(at)
    assert "💵 No budget: the turn's cost is shown, not limited." in page
    assert "This model costs $2 / $0.2 / $8 per million input / cached / output tokens." in page
