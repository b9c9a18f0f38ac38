"""Tools that ask a person first, on the page (AppTest, the session's real Redis and pool): the parked turn
shows its request with Approve and Deny inside the turn; each answer, a second tab's late answer, an
expiry and Stop end it as they should, and the page says who answered and how. Tests wait for events
(the state's version), never a fixed sleep."""

from __future__ import annotations

import pytest

from agent.contract import Kind, Outcome, Status
from agent.turn import approvals
from agent.ui import render, timeline, tool_sources
from agent.ui import state as ui
from agent.ui.follower import IDLE_TICK_MS
from tests.apptest_page import app, autorefreshes, texts
from tests.conftest import ask, wait_done
from tests.test_app import app_env, assert_no_exception  # noqa: F401 - app_env: the page's environment
from tests.test_approvals import ASKS, parked, tool_results

pytestmark = pytest.mark.usefixtures("pool")


def opened(cid: str):
    at = app(cid)
    at.run()
    assert_no_exception(at)
    return at


def has_button(at, key: str) -> bool:
    return key in [b.key for b in at.button]


def request_buttons(at, request_id: str):
    return at.button(key=f"approve-{request_id}"), at.button(key=f"deny-{request_id}")


def test_a_parked_turn_shows_its_request_in_the_turn_and_costs_what_an_idle_page_does(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    at = opened(cid)
    page = texts(at)
    assert "wants to run `calculator`" in page and "Waiting for your approval" in page, page[-2000:]
    assert any("6*7" in code.value for code in at.code), "the arguments, in a code block"
    assert "expires at" in page and "UTC" in page
    approve, deny = request_buttons(at, request["id"])
    assert approve.label.startswith("✅") and deny.label.startswith("🚫")
    assert not at.progress, "no budget bar: no job runs"
    assert "Working on it" not in page and "in the queue" not in page
    assert at.chat_input[0].disabled and at.button(key="stop")
    # Followed as an idle page is: one component at the idle cadence.
    assert [t["interval"] for t in autorefreshes(at)] == [IDLE_TICK_MS]
    assert ui.phase_of(store.read(cid)) == ui.PARKED


def test_approve_runs_the_tool_and_the_turn_ends_with_its_result(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    at = opened(cid)
    approve, _ = request_buttons(at, request["id"])
    approve.click().run()
    assert_no_exception(at)
    final = wait_done(store, cid)
    assert final["status"] == Status.DONE and tool_results(final)[request["call_id"]] == "42"
    at.run()
    page = texts(at)
    assert "✅ Approved on the page" in page and "calculator" in page, page[-2000:]
    assert not has_button(at, f"approve-{request['id']}"), "the request is answered: no buttons left"
    assert not at.chat_input[0].disabled


def test_deny_ends_the_turn_declined_and_says_so(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    at = opened(cid)
    _, deny = request_buttons(at, request["id"])
    deny.click().run()
    final = wait_done(store, cid)
    assert final["status"] == Status.DONE and tool_results(final)[request["call_id"]] == approvals.DENIED_RESULT
    at.run()
    page = texts(at)
    assert "🚫 Declined on the page" in page and "expired" not in page, page[-2000:]


def test_an_expired_request_reads_as_nobody_answering_not_as_a_decline(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS.with_changes(approval_timeout_s=1.0))
    parked(store, cid)
    at = opened(cid)  # parked, or (it waits on the request while drawn) already expired and going on
    wait_done(store, cid, timeout_s=15)  # the pool's watch expires it; no page acts
    at.run()
    page = texts(at)
    assert "⌛ Nobody answered the request to run **calculator**" in page.replace("\\", ""), page[-2000:]
    assert "it expired" in page and "Declined" not in page


def test_a_second_tab_answering_late_is_told_it_was_already_answered(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    first, second = opened(cid), opened(cid)
    assert has_button(second, f"approve-{request['id']}"), "every tab shows the request"
    request_buttons(first, request["id"])[0].click().run()
    request_buttons(second, request["id"])[0].click().run()
    assert_no_exception(second)
    assert "already answered: approved on the page" in texts(second)
    final = wait_done(store, cid)
    assert [s["answered_by"] for s in final["steps"] if s["kind"] == Kind.APPROVAL] == [approvals.BY_PAGE]


def test_stop_on_a_parked_turn_ends_it_cancelled(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    request = parked(store, cid)["approval"]
    at = opened(cid)
    at.button(key="stop").click().run()
    assert_no_exception(at)
    state = store.read(cid)
    assert state["done"] and state["status"] == Status.CANCELLED
    at.run()
    assert not has_button(at, f"approve-{request['id']}") and not at.chat_input[0].disabled
    assert "Stopped" in texts(at)


def test_the_timeline_puts_the_wait_between_the_two_jobs_clocks(store, queue):
    cid = ask(store, queue, "what is 6*7?", ASKS)
    asked = parked(store, cid)
    assert approvals.answer(store, queue, cid, Outcome.APPROVED, approvals.BY_PAGE).taken
    final = wait_done(store, cid)
    steps = [s for s in final["steps"] if s["turn_id"] == final["turn_id"]]
    summary = final["turns"][-1]
    [wait] = [s for s in steps if s["kind"] == Kind.APPROVAL]
    t0 = timeline.origin(summary, steps)
    assert t0 == pytest.approx(asked["started_at"], abs=0.01), "the first job's start"
    rules = {r["clock"]: r["at_s"] for r in timeline.clock_rules(summary, steps)}
    assert set(rules) == {"deadline (job 1)", "job timeout (job 1)", "deadline (job 2)", "job timeout (job 2)"}
    assert rules["deadline (job 1)"] == pytest.approx(asked["deadline_at"] - t0, abs=0.01)
    assert rules["deadline (job 2)"] == pytest.approx(final["deadline_at"] - t0, abs=0.01)
    rows = [r for r in timeline.timeline_rows(steps, summary) if r["layer"] == "step"]
    [bar] = [r for r in rows if r["what"] == "waiting for a person"]
    assert bar["start_s"] == pytest.approx(wait["started_at"] - t0, abs=0.01)
    assert bar["start_s"] + bar["took_s"] == pytest.approx(wait["ended_at"] - t0, abs=0.01)
    assert all(r["start_s"] >= 0 for r in rows), "the first job's steps are not pushed to the continuation's start"
    spec = timeline.timeline_chart(steps, summary)
    assert all(line in spec["title"]["subtitle"] for line in timeline.APPROVAL_SUBTITLE)
    assert "waited" in render.clocks_caption(summary, steps)


def test_tools_that_ask_first_are_marked_in_the_sidebar():
    marked = {"name": "add_note", "description": "a note", "needs_approval": True}
    plain = {"name": "calculator", "description": "sums"}
    assert tool_sources.asks_first(marked) and not tool_sources.asks_first(plain)
    assert tool_sources.asks_first(plain, ("calculator",)), "the settings' approve_tools count too"
    assert "✋ (asks first" in tool_sources.tool_help(marked)
    assert "asks first" not in tool_sources.tool_help({"name": "x", "description": "y", "needs_approval": "yes"})


def test_the_sidebar_marks_the_tools_the_settings_make_ask(store, monkeypatch):
    monkeypatch.setenv("AGENT_APPROVE_TOOLS", "calculator")
    at = app()
    at.run()
    assert_no_exception(at)
    captions = [c for c in at.caption if "tool(s)" in c.value]
    if not captions:
        pytest.skip("the workers have not listed their tools in this Redis yet")
    assert any("ask" in c.value and "✋" in c.value for c in captions), [c.value for c in captions]
    assert any("calculator ✋" in opt for ms in at.multiselect for opt in ms.options)


def test_the_parked_status_never_claims_a_job_runs():
    state = {"status": Status.AWAITING_APPROVAL, "done": False, "approval": {"name": "calculator"}}
    assert ui.phase_of(state) == ui.PARKED
    assert ui.phase_of({**state, "status": Status.QUEUED}) == ui.LIVE
    assert ui.phase_of({**state, "done": True}) == ui.IDLE


HOSTILE_REQUESTS = [
    "text",  # like every value that is not a request (None, 5, [], {}, {"id": "x"}): it reads as none
    {"id": 5, "name": ["a"], "expires_at": "soon", "arguments": {"a": 1}},
    {"id": "x`y", "name": "a`](javascript:alert(1))", "expires_at": 1e300, "arguments": "<script>alert(1)</script>",
     "asked_at": -1, "answer": None},
    {"id": "x", "name": "**bold**\n# heading", "expires_at": float("nan"), "arguments": "```\n" * 50},
    {"id": "x", "name": "calculator", "expires_at": 1.0, "arguments": "{}", "answer": "maybe", "answered_by": 7},
]


@pytest.mark.parametrize("stored", HOSTILE_REQUESTS, ids=range(len(HOSTILE_REQUESTS)))
def test_a_parked_turn_with_a_request_of_any_shape_is_drawn_and_can_be_stopped(store, queue, stored):
    import json

    from agent.conversation.keys import Keys

    cid = ask(store, queue, "what is 6*7?", ASKS)
    parked(store, cid)
    meta = Keys.of(cid).meta
    doc = json.loads(store.redis.hget(meta, "doc"))
    doc["approval"] = stored
    store.redis.hset(meta, "doc", json.dumps(doc, allow_nan=True))
    store.redis.hincrby(meta, "version", 1)
    at = opened(cid)
    page = texts(at)
    assert "Waiting for your approval" in page, page[-1500:]
    assert "javascript:" not in "".join(str(m.value) for m in at.markdown)
    at.button(key="stop").click().run()
    assert_no_exception(at)
    final = store.read(cid)
    assert final["done"] and final["status"] == Status.CANCELLED
