"""The page's logic, headless with AppTest, against the session's real Redis (and real workers where a
turn must actually run). States are written with the Store API to see how each one renders."""

from __future__ import annotations

import json
import re
import time

import pytest
import streamlit as st
from rq.serializers import JSONSerializer
from streamlit.testing.v1 import AppTest

from agent import services
from agent.endings import turn_summary, write_ending
from agent.queue import JOB_FUNCTION, MAX_MESSAGE_CHARS, SafeJob, new_id
from agent.store import Store
from agent.ui import render, timeline
from agent.ui.markdown import safe_markdown
from tests.conftest import FAST, ROOT, wait_done

APP = str(ROOT / "app.py")
RUN_TIMEOUT_S = 15
ENV = {
    "AGENT_PROVIDER": "demo",
    "AGENT_MODEL": "demo",
    "AGENT_WORKERS": "0",  # the session's `pool` fixture runs the turns
    "AGENT_POLL_INTERVAL_MS": "250",
    "AGENT_JOB_TIMEOUT": str(FAST.job_timeout_s),
    "AGENT_DEADLINE_MARGIN": str(FAST.deadline_margin_s),
    "AGENT_CALL_TIMEOUT_CAP": str(FAST.call_timeout_cap_s),
    "AGENT_MIN_CALL_SECONDS": str(FAST.min_call_s),
}


@pytest.fixture(scope="module", autouse=True)
def app_env(redis_url):
    """The app reads REDIS_URL and friends from the environment; its services are process-wide, so
    they are stopped (and Streamlit's resource cache cleared) when this module is done."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REDIS_URL", redis_url)
        for name, value in ENV.items():
            mp.setenv(name, value)
        yield
        services.shutdown()
        st.cache_resource.clear()


def app(cid: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=RUN_TIMEOUT_S)
    if cid:
        at.query_params["c"] = cid
    return at


def texts(at: AppTest) -> str:
    """Every piece of text on the page, for plain assertions."""
    parts = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "code", "title", "toast"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [str(e.label) for e in at.expander]
    # Untrusted text reaches the page with its Markdown characters escaped; read it as shown.
    return re.sub(r"\\(.)", r"\1", "\n".join(parts))


def autorefresh_present(at: AppTest) -> bool:
    """streamlit-autorefresh is a custom component: AppTest shows it as an unknown element."""
    return any(getattr(node, "type", "") == "component_instance" or "autorefresh" in repr(getattr(node, "proto", ""))
               for node in _walk(at._tree))


def _walk(node):
    yield node
    for child in getattr(node, "children", {}).values():
        yield from _walk(child)


def assert_no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


# -- writing states directly --------------------------------------------------------------------


def begin(store: Store, text: str = "What is 17*23?", *, job_id: str | None = None,
          enqueued_at: float | None = None) -> tuple[str, str]:
    cid, turn_id = new_id(), new_id()
    doc = {"status": "queued", "error": None, "config": FAST.to_dict(), "job_id": job_id or f"turn-{turn_id}",
           "enqueued_at": enqueued_at or time.time(), "deadline_at": None, "job_timeout_at": None,
           "started_at": None, "current_step": None}
    store.begin_turn(cid, turn_id, {"role": "user", "content": text}, doc)
    return cid, turn_id


def running_doc(store: Store, cid: str) -> dict:
    state = store.read(cid)
    now = time.time()
    doc = {k: state[k] for k in ("error", "config", "job_id", "enqueued_at", "current_step")}
    doc.update(status="running", started_at=now - 1, deadline_at=now + 3, job_timeout_at=now + 5,
               current_step={"kind": "model", "name": "demo", "started_at": now - 0.5, "timeout_s": 3.0})
    return doc


def step(turn_id: str, index: int, kind: str, name: str, t0: float, **extra) -> dict:
    return {"turn_id": turn_id, "index": index, "kind": kind, "name": name, "started_at": t0 + index * 0.1,
            "ended_at": t0 + index * 0.1 + 0.05, "duration_s": 0.05, "timeout_s": 3.0, "remaining_s": 3.5,
            "outcome": "ok", **extra}


def make_running(store: Store, cid: str, turn_id: str) -> None:
    doc = running_doc(store, cid)
    t0 = doc["started_at"]
    function = {"name": "calculator", "arguments": '{"expression": "17*23"}'}
    call = {"id": "call_1", "type": "function", "function": function}
    store.publish(cid, turn_id, doc, new_messages=[
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ], new_steps=[
        step(turn_id, 1, "model", "demo", t0, attempt=1),
        step(turn_id, 2, "tool", "calculator", t0, arguments='{"expression": "17*23"}', result="391"),
    ])


def make_done(store: Store, cid: str, turn_id: str, answer: str) -> None:
    doc = running_doc(store, cid)
    make_running(store, cid, turn_id)
    doc.update(status="done", current_step=None, ended_at=time.time())
    store.publish(cid, turn_id, doc, done=True, new_messages=[{"role": "assistant", "content": answer}],
                  new_steps=[step(turn_id, 3, "model", "demo", doc["started_at"], attempt=1)],
                  summary=turn_summary(turn_id, doc, doc["ended_at"]))


def make_status(store: Store, status: str) -> tuple[str, str]:
    cid, turn_id = begin(store)
    if status == "running":
        make_running(store, cid, turn_id)
    elif status == "done":
        make_done(store, cid, turn_id, "**17*23 = 391**")
    elif status != "queued":
        make_running(store, cid, turn_id)
        assert write_ending(store, cid, turn_id, status, status, f"The turn ended: {status}.")
    return cid, turn_id


# -- the page -----------------------------------------------------------------------------------


def test_a_submitted_message_is_enqueued_and_followed_until_the_answer(store, pool):
    at = app()
    at.run()
    assert_no_exception(at)
    assert not autorefresh_present(at)
    at.chat_input[0].set_value("What is 17*23?").run()
    assert_no_exception(at)
    cid = at.query_params["c"]
    state = store.read(cid)
    assert state["history"][0] == {"role": "user", "content": "What is 17*23?"}
    assert state["job_id"]
    wait_done(store, cid)
    at.run()  # the poll that sees done
    assert_no_exception(at)
    assert "17*23 = 391" in texts(at)
    assert any("calculator" in e.label for e in at.expander)
    assert not autorefresh_present(at)
    assert not at.chat_input[0].disabled


@pytest.mark.parametrize("status", ["queued", "running", "done", "failed", "timed_out", "cancelled"])
def test_every_status_renders_and_only_a_turn_in_flight_polls(store, status):
    cid, _ = make_status(store, status)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    page = texts(at)
    in_flight = status in ("queued", "running")
    assert autorefresh_present(at) is in_flight
    assert at.chat_input[0].disabled is in_flight
    if status == "queued":
        assert "Waiting for a worker" in page
    elif status == "running":
        assert "Working on it" in page and "calculator" in page
        assert at.progress, "the budget bar"
        assert at.button(key="stop")
    elif status == "done":
        assert "17*23 = 391" in page and "three clocks" in "\n".join(e.label for e in at.expander)
    else:
        assert f"The turn ended: {status}." in page
        assert render.STATUS_LABELS[status].split(" ", 1)[1] in page


def test_polling_stops_on_the_run_that_sees_done(store):
    cid, turn_id = make_status(store, "running")
    at = app(cid)
    at.run()
    assert autorefresh_present(at)
    at.run()  # a poll with nothing new
    assert autorefresh_present(at)
    write_ending(store, cid, turn_id, "timed_out", "deadline", "I ran out of time.")
    at.run()
    assert_no_exception(at)
    assert not autorefresh_present(at)
    assert "I ran out of time." in texts(at)


def test_a_lost_worker_gets_its_ending_written_and_the_page_says_so(store):
    cid, _ = begin(store, job_id="turn-no-such-job", enqueued_at=time.time() - 60)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    state = store.read(cid)
    assert state["done"] and state["status"] == "failed"
    assert state["error"]["kind"] == "worker_lost"
    assert "The worker was lost" in texts(at)
    assert not autorefresh_present(at)
    assert not at.chat_input[0].disabled, "the user can go on chatting"


def test_a_worker_silent_past_its_job_timeout_counts_as_lost(store, queue):
    cid, turn_id = begin(store)
    # The job's record exists (not in the queue, so no worker takes it) but nobody writes any more.
    SafeJob.create(JOB_FUNCTION, args=(cid, turn_id), id=f"turn-{turn_id}", connection=queue.connection,
                   serializer=JSONSerializer).save()
    doc = running_doc(store, cid)
    doc.update(started_at=time.time() - 60, deadline_at=time.time() - 50, job_timeout_at=time.time() - 40)
    store.publish(cid, turn_id, doc)
    at = app(cid)
    at.run()
    assert store.read(cid)["status"] == "failed"
    assert "The worker was lost" in texts(at)


@pytest.mark.parametrize("text", ["   ", "x" * (MAX_MESSAGE_CHARS + 1)])
def test_bad_input_is_refused_with_a_message_and_nothing_is_enqueued(store, queue, text):
    at = app()
    at.run()
    queued_before = queue.count
    at.chat_input[0].set_value(text).run()
    assert_no_exception(at)
    assert at.error, "a clear message"
    assert "c" not in at.query_params
    assert queue.count == queued_before
    if text.strip():
        assert "limit" in at.error[0].value
        assert any(text in c.value for c in at.code), "the typed text is not lost"


def test_an_unknown_conversation_in_the_url_starts_a_fresh_chat_and_says_so():
    at = app("no-such-conversation")
    at.run()
    assert_no_exception(at)
    assert "was not found" in texts(at)
    assert "c" not in at.query_params


def test_a_reload_shows_the_same_conversation(store):
    cid, _ = make_status(store, "done")
    first, second = app(cid), app(cid)  # two tabs, or a reload
    first.run()
    second.run()
    assert "17*23 = 391" in texts(first) and "17*23 = 391" in texts(second)
    assert second.query_params["c"] == cid


def test_stop_on_a_queued_turn_ends_it_cancelled(store):
    cid, turn_id = make_status(store, "queued")
    at = app(cid)
    at.run()
    at.button(key="stop").click().run()
    assert_no_exception(at)
    assert store.cancel_requested(turn_id)
    state = store.read(cid)
    assert state["done"] and state["status"] == "cancelled"
    assert not autorefresh_present(at)


def test_stop_on_a_running_turn_asks_the_worker(store):
    cid, turn_id = make_status(store, "running")
    at = app(cid)
    at.run()
    at.button(key="stop").click().run()
    assert store.cancel_requested(turn_id)
    assert "Stop requested" in texts(at)
    assert autorefresh_present(at), "it keeps polling until the worker writes the ending"


def test_a_reply_cannot_show_images_or_html(store):
    cid, turn_id = begin(store)
    make_done(store, cid, turn_id, 'Look ![tracker](http://evil.test/x.png) <img src="http://evil.test/y.png"> '
                                   "and ![ref][1]\n\n[1]: http://evil.test/z.png")
    at = app(cid)
    at.run()
    assert_no_exception(at)
    reply = [m for m in at.markdown if "Look" in m.value]
    assert reply
    for element in at.markdown:
        assert "![" not in element.value
        assert "<img" not in element.value.lower()
        assert not element.proto.allow_html
    assert "(image not shown: tracker)" in reply[0].value


def test_bad_configuration_shows_a_readable_error_not_a_traceback(monkeypatch):
    monkeypatch.setenv("AGENT_DEADLINE_MARGIN", "600")
    at = app()
    at.run()
    assert_no_exception(at)
    assert "AGENT_DEADLINE_MARGIN" in at.error[0].value


def test_invalid_clocks_in_the_sidebar_show_the_reason_and_disable_sending():
    at = app()
    at.run()
    at.number_input(key="sb_deadline_margin_s").set_value(30.0).run()
    assert_no_exception(at)
    assert any("AGENT_DEADLINE_MARGIN" in e.value for e in at.sidebar.error)
    assert at.chat_input[0].disabled


# -- the pure parts -----------------------------------------------------------------------------


def test_safe_markdown_neutralises_every_image_form():
    text = safe_markdown('a ![x](http://e/1.png "t") b ![y][r] c ![z] <IMG src=x> [link](http://ok)')
    assert "![" not in text and "<IMG" not in text
    assert "[link](http://ok)" in text


def test_the_timeline_has_a_bar_and_a_timeout_per_step_and_both_clocks():
    t0 = 1000.0
    steps = [step("t", 1, "model", "demo", t0, attempt=1), step("t", 2, "tool", "calculator", t0),
             {**step("t", 3, "skip", "demo", t0), "timeout_s": None, "outcome": "skipped"}]
    summary = {"started_at": t0, "deadline_at": t0 + 4, "job_timeout_at": t0 + 6, "ended_at": t0 + 1}
    rows = timeline.timeline_rows(steps, summary)
    assert [r["what"] for r in rows if r["layer"] == "step"] == ["model call", "tool run", "skipped call"]
    assert sum(r["layer"] == "timeout" for r in rows) == 2
    assert [r["clock"] for r in timeline.clock_rules(summary)] == ["deadline", "job timeout"]
    assert timeline.timeline_chart(steps, summary) is not None


def test_turns_are_split_at_each_user_message_with_their_own_steps():
    state = {"history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
                         {"role": "user", "content": "b"}],
             "steps": [{"turn_id": "t1", "kind": "model"}, {"turn_id": "t2", "kind": "model"}],
             "turns": [{"turn_id": "t1", "status": "done"}], "turn_id": "t2", "done": False, "status": "running"}
    turns = render.split_turns(state)
    assert [len(t["steps"]) for t in turns] == [1, 1]
    assert [t["in_flight"] for t in turns] == [False, True]


def test_a_finished_turns_timeline_is_built_once_not_on_every_poll(monkeypatch):
    from agent.ui import render

    built = []
    real = render.timeline_chart
    monkeypatch.setattr(render, "timeline_chart", lambda *a, **k: built.append(1) or real(*a, **k))
    t0 = 1_000_000.0
    steps = json.dumps([step("t-cache", 1, "model", "demo", t0)])
    summary = json.dumps(turn_summary("t-cache", {"status": "done", "started_at": t0, "deadline_at": t0 + 100,
                                                  "job_timeout_at": t0 + 120, "config": {}}, t0 + 2))
    render.finished_chart_spec.clear()
    first = render.finished_chart_spec(steps, summary, False)
    second = render.finished_chart_spec(steps, summary, False)
    assert first == second and first["layer"]
    assert len(built) == 1
