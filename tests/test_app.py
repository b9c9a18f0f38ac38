"""The page's logic, headless with AppTest, against the session's real Redis (and real workers where a
turn must actually run). States are written with the Store API to see how each one renders."""

from __future__ import annotations

import json
import time
import types

import pytest
from rq.serializers import JSONSerializer
from streamlit.testing.v1 import AppTest

from agent.contract import turn_summary
from agent.conversation import words
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.conversation.turns import current_turn, live_text, split_turns
from agent.queue import JOB_FUNCTION, MAX_MESSAGE_CHARS, SafeJob, new_id
from agent.text.markdown import safe_markdown
from agent.ui import render, timeline
from agent.ui import state as ui
from tests import live_owner
from tests.apptest_page import APP, RUN_TIMEOUT_S, app, autorefreshes, page_environment, texts, walk
from tests.conftest import FAST, wait_done
from tests.live_owner import keep_alive

ENV = {
    "AGENT_PROVIDER": "demo",
    "AGENT_MODEL": FAST.model,
    "AGENT_WORKERS": "0",  # the session's `pool` fixture runs the turns
    "AGENT_POLL_INTERVAL_MS": "250",
    "AGENT_JOB_TIMEOUT": str(FAST.job_timeout_s),
    "AGENT_DEADLINE_MARGIN": str(FAST.deadline_margin_s),
    "AGENT_CALL_TIMEOUT_CAP": str(FAST.call_timeout_cap_s),
    "AGENT_MIN_CALL_SECONDS": str(FAST.min_call_s),
}


@pytest.fixture(scope="module", autouse=True)
def app_env(redis_url):
    with page_environment(redis_url, ENV):
        yield


def autorefresh_present(at: AppTest) -> bool:
    """The page ticks at the in-flight cadence. (An idle page on a conversation keeps its component at
    IDLE_TICK_MS: a tick that only restarts its follower, which meanwhile waits on Redis.)"""
    from agent.ui.follower import IDLE_TICK_MS

    return any(args.get("interval") != IDLE_TICK_MS for args in autorefreshes(at))


def assert_no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


# -- writing states directly --------------------------------------------------------------------


def begin(store: Store, text: str = "What is 17*23?", *, job_id: str | None = None,
          enqueued_at: float | None = None, cid: str | None = None, config: dict | None = None) -> tuple[str, str]:
    cid, turn_id = cid or new_id(), new_id()
    doc = {"status": "queued", "error": None, "config": config or FAST.to_dict(),
           "job_id": job_id or f"turn-{turn_id}",
           "enqueued_at": enqueued_at or time.time(), "deadline_at": None, "job_timeout_at": None,
           "started_at": None, "current_step": None}
    store.begin_turn(cid, turn_id, {"role": "user", "content": text}, doc)
    return cid, turn_id


def running_doc(store: Store, cid: str) -> dict:
    state = store.read(cid)
    now = time.time()
    doc = {k: state[k] for k in ("error", "config", "job_id", "enqueued_at", "current_step")}
    # Its clocks far off: with its live owner (make_status), no look takes it for lost while a test, slowed
    # by a busy machine, looks at it.
    doc.update(status="running", started_at=now - 1, deadline_at=now + 60, job_timeout_at=now + 80,
               current_step={"kind": "model", "name": "demo", "started_at": now - 0.5, "timeout_s": 3.0})
    return doc


def step(turn_id: str, index: int, kind: str, name: str, t0: float, **extra) -> dict:
    return {"turn_id": turn_id, "index": index, "kind": kind, "name": name, "started_at": t0 + index * 0.1,
            "ended_at": t0 + index * 0.1 + 0.05, "duration_s": 0.05, "timeout_s": 3.0, "remaining_s": 3.5,
            "outcome": "ok", **extra}


def make_running(store: Store, cid: str, turn_id: str) -> None:
    """The turn as a worker runs it: its heartbeat in (for 3 s: a test that needs it longer beats again), a step
    each of the model and the calculator published."""
    from agent.turn.heartbeat import ALIVE_MS

    doc = running_doc(store, cid)
    store.flags.beat(cid, turn_id, doc["job_id"], ALIVE_MS)
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
    """A conversation whose turn is in `status`; one in flight has a live owner until the test ends."""
    cid, turn_id = begin(store)
    if status in ("queued", "running"):
        if status == "running":
            make_running(store, cid, turn_id)
        keep_alive(store, cid)
    elif status == "done":
        make_done(store, cid, turn_id, "**17*23 = 391**")
    else:
        make_running(store, cid, turn_id)
        assert write_ending(store, cid, turn_id, Ending(status, status, f"The turn ended: {status}."))
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
        assert words.status_words(status) in page


def test_polling_stops_on_the_run_that_sees_done(store):
    cid, turn_id = make_status(store, "running")
    at = app(cid)
    at.run()
    assert autorefresh_present(at)
    at.run()  # a poll with nothing new
    assert autorefresh_present(at)
    write_ending(store, cid, turn_id, Ending("timed_out", "deadline", "I ran out of time."))
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
    assert "Stopping…" in texts(at)
    assert "stop" not in [b.key for b in at.button], "the click is answered in place of the button"
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
    summary = turn_summary("t", {"started_at": t0, "deadline_at": t0 + 4, "job_timeout_at": t0 + 6}, t0 + 1)
    rows = timeline.timeline_rows(steps, summary)
    assert [r["what"] for r in rows if r["layer"] == "step"] == ["model call", "tool run", "skipped call"]
    assert sum(r["layer"] == "timeout" for r in rows) == 2
    assert [r["clock"] for r in timeline.clock_rules(summary)] == ["deadline", "job timeout"]
    assert timeline.timeline_chart(steps, summary) is not None


def test_the_timeline_is_valid_vega_lite_for_every_kind_of_turn():
    """The spec is written as a dict (no Altair at run time): Vega-Lite's own schema checks it, over
    seeded random turns (kinds, outcomes, clocks present or not, a step running now, zoom)."""
    import random

    import jsonschema
    from altair.vegalite.v6.schema import SCHEMA_URL, load_schema

    validator = jsonschema.Draft7Validator(load_schema())
    rng = random.Random(12)
    assert timeline.VEGA_LITE_SCHEMA == SCHEMA_URL, "the version Streamlit's Altair draws"
    for _ in range(40):
        t0 = 1000.0
        steps = []
        for n in range(rng.randint(0, 6)):
            kind = rng.choice(["model", "tool", "retry", "skip"])
            one = step("t", n + 1, kind, rng.choice(["demo", "calculator", "wait"]), t0 + n, attempt=rng.randint(1, 3))
            one["outcome"] = rng.choice(["ok", "timeout", "error", "skipped", "refused"])
            one["timeout_s"] = rng.choice([None, 0.5, 8.0])
            steps.append(one)
        clocks = {"started_at": t0}
        if rng.random() < 0.8:
            clocks |= {"deadline_at": t0 + 40, "job_timeout_at": t0 + 50}
        summary = turn_summary("t", clocks, t0 + 9)
        running = None
        if rng.random() < 0.5:
            running = {"kind": "model", "name": "demo", "started_at": t0 + 8, "timeout_s": 5}
        spec = timeline.timeline_chart(steps, summary, now=t0 + 9 if running else None, current=running,
                                       zoom=rng.random() < 0.5)
        if not steps and not running:
            assert spec is None
            continue
        errors = sorted(validator.iter_errors(spec), key=str)
        assert not errors, errors[0].message


def approval_turn(answered_after_s: float, parks: int = 1) -> tuple[list[dict], dict]:
    """A turn that asked first `parks` times on the demo clocks (20 s job timeout, 15 s deadline), each answer
    `answered_after_s` after its request: each job's clocks from its start, as the answers record them."""
    t0, steps, start = 1000.0, [], 1000.0
    for n in range(parks):
        steps.append(step("t", 2 * n + 1, "model", "demo", start, attempt=1))
        asked = start + 0.1
        steps.append({**step("t", 2 * n + 2, "approval", "calculator", asked), "timeout_s": None, "outcome": "approved",
                      "ended_at": asked + answered_after_s, "deadline_at": start + 15, "job_timeout_at": start + 20})
        start = asked + answered_after_s
    steps.append(step("t", 2 * parks + 1, "tool", "calculator", start))
    clocks = {"started_at": start, "deadline_at": start + 15, "job_timeout_at": start + 20}
    summary = turn_summary("t", clocks, start + 1)
    summary["config"] = {"job_timeout_s": 20}
    assert timeline.origin(summary, steps) == pytest.approx(t0)
    return steps, summary


@pytest.mark.parametrize("parks", [1, 2])
@pytest.mark.parametrize("answered_after_s", [0.5, 3, 4.9, 5.0, 5.2, 8, 15, 19.9, 40])
def test_the_clocks_labels_never_meet_and_the_legend_and_title_fit_the_narrowest_chart(answered_after_s, parks):
    """A regression: on an approval's timeline "deadline (job 2)" was drawn over "job timeout (job 1)" (one row
    each per job, 15-17 px apart, whatever their places), and the legend, five entries a row, ran past the chart's
    right edge ("timeout it was giv…"), as did the approval's one-line subtitle. On the narrowest plot the page
    draws, with each label as wide as its text can be, two labels that share some width are a line apart."""
    steps, summary = approval_turn(answered_after_s, parks)
    spec = timeline.timeline_chart(steps, summary)
    x_end = spec["layer"][0]["encoding"]["x"]["scale"]["domain"][1]
    labels = [layer for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert len(labels) == 2 * (parks + 1)
    placed = [(timeline.label_extent_px(layer["data"]["values"][0], x_end), layer["mark"]["y"]) for layer in labels]
    for n, ((left, right), y) in enumerate(placed):
        assert y >= 0
        for (other_left, other_right), other_y in placed[n + 1:]:
            if left < other_right and other_left < right:  # they share some width: a line apart at least
                assert abs(y - other_y) >= 1.5 * timeline.LABEL_FONT_PX, (placed, n)
    # The band above the bars holds every row of labels: the chart grows with them.
    rows = 1 + max((y - 2) // timeline.LABEL_ROW_PX for _, y in placed)
    assert spec["height"] >= 220 + 36 * len(steps) + timeline.LABEL_ROW_PX * (rows - 2)

    legend = next(layer["encoding"]["color"]["legend"] for layer in spec["layer"] if "color" in layer["encoding"])
    widest = 20 + 7 * max(len(label) for label in timeline.COLOURS)  # a symbol and the label, at the legend's 11 px
    assert legend["columns"] * widest <= timeline.NARROWEST_PLOT_PX, legend
    assert legend.get("labelLimit", 0) >= widest - 20, "no label is cut short either"
    longest = max(len(line) for line in timeline.CHART_SUBTITLE)
    assert all(len(line) <= longest for line in spec["title"]["subtitle"]), spec["title"]["subtitle"]


def test_turns_are_split_at_each_user_message_with_their_own_steps():
    state = {"history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
                         {"role": "user", "content": "b"}],
             "steps": [{"turn_id": "t1", "kind": "model"}, {"turn_id": "t2", "kind": "model"}],
             "turns": [{"turn_id": "t1", "status": "done"}], "turn_id": "t2", "done": False, "status": "running"}
    turns = split_turns(state)
    assert [len(t.steps) for t in turns] == [1, 1]
    assert [t.in_flight for t in turns] == [False, True]


def test_splitting_a_long_conversation_reads_each_step_once_not_once_per_turn():
    reads = []

    class Step(dict):
        def get(self, key, default=None):
            reads.append(key)
            return super().get(key, default)

    turns = 300
    state = {"history": [m for n in range(turns) for m in ({"role": "user", "content": str(n)},
                                                           {"role": "assistant", "content": "A"})],
             "steps": [Step(turn_id=f"t{n}", kind="model") for n in range(turns) for _ in range(3)],
             "turns": [{"turn_id": f"t{n}", "status": "done"} for n in range(turns)], "turn_id": f"t{turns - 1}",
             "done": True, "status": "done"}
    split = split_turns(state)
    assert [len(t.steps) for t in split] == [3] * turns
    assert len(reads) <= 2 * len(state["steps"])


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


# -- issue: the page stays live at any length --------------------------------------------------


def chat_of(store: Store, turns: int) -> str:
    """A conversation of `turns` finished turns, each with a tool step."""
    cid = None
    for n in range(1, turns + 1):
        cid, turn_id = begin(store, f"What is {n}*37?", cid=cid)
        make_done(store, cid, turn_id, f"{n}*37 = {n * 37}")
    return cid


def elements(at: AppTest) -> int:
    return sum(1 for _ in walk(at._tree))


def test_a_full_run_draws_the_same_amount_at_100_turns_as_at_12(store):
    # Before: every turn was drawn in full on every run, so a run cost grew with the conversation.
    sizes = {}
    chats = {turns: chat_of(store, turns) for turns in (12, 100)}  # both first: the sidebar lists the same ones
    for turns in (12, 100):
        at = app(chats[turns])
        at.run()
        assert_no_exception(at)
        sizes[turns] = elements(at)
        assert f"{turns}*37 = {turns * 37}" in texts(at)
        assert at.button(key="show-earlier").label == f"Show {turns - render.RECENT_TURNS} earlier turns"
    assert sizes[100] == sizes[12]


def test_earlier_turns_are_shown_on_request(store):
    at = app(chat_of(store, render.RECENT_TURNS + 3))
    at.run()
    assert "1*37 = 37" not in texts(at)
    at.button(key="show-earlier").click().run()
    assert_no_exception(at)
    assert "1*37 = 37" in texts(at)


def test_the_turn_in_flight_is_found_from_the_end_without_walking_the_conversation():
    history = [{"role": "user", "content": "old"}, {"role": "assistant", "content": "A"}] * 500
    history += [{"role": "user", "content": "now"}, {"role": "assistant", "content": None, "tool_calls": []}]
    steps = [{"turn_id": f"t{i // 2}", "kind": "model"} for i in range(1000)] + [{"turn_id": "live", "kind": "model"}]
    state = {"history": history, "steps": steps, "turn_id": "live", "done": False, "status": "running"}
    turn = current_turn(state)
    assert [m.get("content") for m in turn.messages] == ["now", None]
    assert turn.steps == [{"turn_id": "live", "kind": "model"}]
    assert turn.in_flight


def test_a_started_turn_with_safeguards_on_is_not_said_to_run_with_safeguards_off(store, queue):
    # Before: any turn whose job had started but not yet written was described as "safeguards off".
    from rq.job import JobStatus

    results = {}
    for safeguards in (True, False):
        cid, turn_id = begin(store, config=FAST.with_changes(safeguards=safeguards).to_dict())
        job = SafeJob.create(JOB_FUNCTION, args=(cid, turn_id), id=f"turn-{turn_id}", connection=queue.connection,
                             serializer=JSONSerializer)
        job.save()
        job.set_status(JobStatus.STARTED)
        at = app(cid)
        at.run()
        assert_no_exception(at)
        results[safeguards] = texts(at)
    assert "safeguards off" not in results[True] and "picked this turn up" in results[True]
    assert "running this turn with safeguards off" in results[False]


def test_a_refusal_and_its_unsent_text_stay_until_dismissed(store):
    # Before: the "Not sent" box and the unsent text vanished at the next refresh.
    cid, _ = make_status(store, "running")
    at = app(cid)
    at.run()
    at.session_state["agent_flash"] = ("warning", "Not sent: a turn is in flight.", "my long question")
    for _ in range(3):  # polls
        at.run()
        assert "my long question" in [c.value for c in at.code]
        assert "Not sent: a turn is in flight." in texts(at)
    at.button(key="dismiss-flash").click().run()
    assert_no_exception(at)
    assert "my long question" not in [c.value for c in at.code]


def test_the_next_turns_settings_survive_a_reload():
    # Before: a reload put the scenario back to healthy and the clocks back to the defaults.
    at = app()
    at.run()
    at.selectbox(key="sb_scenario").set_value("hang").run()
    at.number_input(key="sb_job_timeout_s").set_value(20).run()
    at.number_input(key="sb_stream_cps").set_value(25.0).run()
    assert_no_exception(at)
    params = {name: at.query_params[name] for name in at.query_params}
    assert params["scenario"] == "hang" and params["job_timeout"] == "20" and params["writing"] == "25"
    reloaded = AppTest.from_file(APP, default_timeout=RUN_TIMEOUT_S)
    for name, value in params.items():
        reloaded.query_params[name] = value
    reloaded.run()
    assert_no_exception(reloaded)
    assert reloaded.selectbox(key="sb_scenario").value == "hang"
    assert reloaded.number_input(key="sb_job_timeout_s").value == 20
    assert reloaded.number_input(key="sb_stream_cps").value == 25.0


def test_a_link_that_names_a_scenario_gives_the_turn_that_scenario_as_the_picker_does(store, pool):
    # Before: `?scenario=slow` typed in the link ran at the default latency; only the picker made it slow.
    from agent.demo.scenarios import SLOW_LATENCY_S

    picked = app()
    picked.run()
    picked.selectbox(key="sb_scenario").set_value("slow").run()
    link = {name: picked.query_params[name] for name in picked.query_params}
    assert link == {"scenario": "slow"}, "the scenario's own latency needs no word of its own"
    at = app()
    at.query_params["scenario"] = "slow"
    at.run()
    assert_no_exception(at)
    assert at.number_input(key="sb_latency_s").value == picked.number_input(key="sb_latency_s").value == SLOW_LATENCY_S
    at.chat_input[0].set_value("What is 17*23?").run()
    cid = at.query_params["c"]
    assert store.read(cid)["config"]["model"].split("~")[0] == "demo:slow"  # its own latency (~: the writing speed)
    at.button(key="stop").click().run()  # its worker is free again before the next test
    wait_done(store, cid)


def test_settings_in_the_url_that_are_not_valid_are_ignored():
    at = app()
    for name, value in {"scenario": "rm -rf", "job_timeout": "-5", "margin": "nan", "latency": "1e9",
                        "provider": "evil", "safeguards": "maybe", "model": "x" * 500, "writing": "-1"}.items():
        at.query_params[name] = value
    at.run()
    assert_no_exception(at)
    assert at.selectbox(key="sb_scenario").value == "healthy"
    assert at.number_input(key="sb_job_timeout_s").value == FAST.job_timeout_s
    assert not at.chat_input[0].disabled


def test_choosing_a_slow_scenario_on_long_clocks_offers_the_demo_clocks(monkeypatch):
    monkeypatch.setenv("AGENT_JOB_TIMEOUT", "120")
    monkeypatch.setenv("AGENT_DEADLINE_MARGIN", "20")
    at = app()
    at.run()
    assert not any("demo clocks" in i.value for i in at.sidebar.info), "healthy needs no offer"
    at.selectbox(key="sb_scenario").set_value("hang").run()
    assert any("demo clocks" in i.value for i in at.sidebar.info)
    at.button(key="offer-demo-clocks").click().run()
    assert at.number_input(key="sb_job_timeout_s").value == 20
    assert not any("demo clocks" in i.value for i in at.sidebar.info)


def test_the_first_screen_says_in_one_sentence_what_is_being_watched():
    at = app()
    at.run()
    first = at.markdown[0].value
    assert first.startswith("You are watching an AI assistant")
    assert first.count(". ") == 0 and len(first) < 250


# -- the words ----------------------------------------------------------------------------------


def clocks_summary(**extra) -> dict:
    t0 = 1_000_000.0
    doc = {"status": "done", "started_at": t0, "deadline_at": t0 + 100, "job_timeout_at": t0 + 120, "config": {}}
    return {**turn_summary("t", doc, t0 + 0.625), **extra}


def test_the_clocks_sentence_gives_points_in_time_not_two_durations_in_a_row():
    text = render.clocks_caption(clocks_summary(), [step("t", 1, "model", "demo", 1_000_000.0)])
    assert "The job ran for **625 ms**." in text
    assert "Its own deadline was at 100.0 s: it ended **99.4 s** early." in text
    assert "The queue would have killed it at 120.0 s." in text
    assert "625 ms, 99.4 s before" not in text


@pytest.mark.parametrize("kind", ["model", "tool", "retry"])
def test_a_step_cut_at_a_timeout_that_ran_to_the_deadline_is_said_as_a_cut_not_a_late_ending(kind):
    """A regression: a hang cut at its 8.0 s timeout, the deadline, ended 4 ms after it, and the caption
    said "it ended 4 ms late", which reads as the guarantee failing."""
    t0 = 1_000_000.0
    deadline = t0 + 9.6
    cut = {**step("t", 2, kind, "demo", t0), "started_at": deadline - 8.0, "timeout_s": 8.0,
           "ended_at": deadline + 0.003, "outcome": "timeout"}
    text = render.clocks_caption(clocks_summary(deadline_at=deadline, ended_at=deadline + 0.004), [cut])
    assert "late" not in text
    what = render.CUT_KINDS[kind]
    assert f"the {what} running then was cut at its 8.00 s timeout, which ran to the deadline" in text
    assert "**4 ms** after it: the time a cut takes" in text


def test_a_turn_that_ended_after_its_deadline_with_no_step_cut_there_is_said_late():
    t0 = 1_000_000.0
    short = {**step("t", 1, "tool", "wait", t0), "timeout_s": 1.0}  # ended well before its limit and the deadline
    text = render.clocks_caption(clocks_summary(ended_at=t0 + 100.5), [short])
    assert "it ended **500 ms** late." in text


def test_a_turn_the_queue_killed_says_it_did_and_does_not_count_zero_calls():
    summary = clocks_summary(status="timed_out", deadline_at=None, ended_at=1_000_000.0 + 120,
                             error={"kind": "job_timeout", "message": "killed"}, config={"safeguards": False})
    text = render.clocks_caption(summary, [])
    assert "The queue killed it at 120.0 s." in text and "would have" not in text
    assert "0 model calls" not in text and "No step was recorded" in text


def test_with_safeguards_off_no_step_mentions_a_deadline_or_its_huge_timeout():
    model = {**step("t", 1, "model", "demo", 0.0), "timeout_s": 3600.0, "remaining_s": 15.0}
    tool = {**step("t", 2, "tool", "wait", 0.0), "timeout_s": 3600.0, "arguments": "{}"}
    for text in (render.model_step_caption(model, safeguards=False), render.tool_status_label(tool, safeguards=False),
                 render.tool_step_caption(tool, safeguards=False)):
        assert "deadline" not in text and "3600" not in text and "1.0 h" not in text
    assert "before the deadline" in render.model_step_caption(model)


def test_the_sidebar_states_every_clock_the_next_turn_gets_including_the_tool_cap(monkeypatch):
    monkeypatch.setenv("AGENT_TOOL_TIMEOUT_CAP", "2.5")
    text = texts(app().run())
    assert f"kill it at {FAST.job_timeout_s} s" in text.replace("**", "")
    assert "each tool run gets at most 2.5 s" in text.replace("**", "")


def test_a_tool_step_says_whether_its_timeout_was_the_tool_cap_or_the_time_left():
    capped = {**step("t", 2, "tool", "time__get_current_time", 0.0), "timeout_s": 60.0, "remaining_s": 98.6}
    last = {**step("t", 2, "tool", "wait", 0.0), "timeout_s": 4.2, "remaining_s": 4.2}
    assert "60.0 s (the tool cap" in render.tool_step_caption(capped)
    assert "4.20 s (the time left before the deadline)" in render.tool_step_caption(last)
    kept = {**last, "timeout_s": 3.45, "remaining_s": 4.2, "kept_s": 0.75}
    assert "3.45 s (the time left before the deadline, less 750 ms kept for the last model call)" in (
        render.tool_step_caption(kept))
    assert "(the tool cap" in render.tool_step_caption({**kept, "timeout_s": 2.0})
    not_run = {**step("t", 3, "tool", "2 tool calls not run", 0.0), "outcome": "skipped", "timeout_s": None,
               "detail": "0.6 s left: too little to run tool calls and still call the model after"}
    caption = render.tool_step_caption(not_run)
    assert caption.startswith("Not run: ") and "too little to run tool calls and still call the model after" in caption


def test_a_turn_with_no_steps_draws_no_empty_chart(store):
    cid, turn_id = begin(store, config=FAST.with_changes(safeguards=False).to_dict())
    now = time.time()
    write_ending(store, cid, turn_id, Ending("timed_out", "job_timeout", "The queue's job timeout killed it."),
                 started_at=now - 6, job_timeout_at=now)
    at = app(cid)
    at.run()
    assert_no_exception(at)
    assert not at.get("vega_lite_chart") and not at.main.toggle
    assert "No step was recorded" in texts(at)


@pytest.mark.parametrize("host", ["evil.test:8501", "127.0.0.1.evil.test:8501", "localhost.evil.test",
                                  "attacker.example"],
                         ids=["name", "loopback-prefix", "localhost-prefix", "no-port"])
def test_a_page_asked_for_under_a_foreign_host_name_refuses_before_showing_any_conversation(
    store, monkeypatch, host
):
    cid, _ = make_status(store, "done")
    at = app(cid)
    at.run()
    assert "17*23 = 391" in texts(at)  # the conversation, as its own page shows it
    from agent.ui import shell

    monkeypatch.setattr(shell, "request_host", lambda: host)  # the Host a rebound name brings
    monkeypatch.setenv("AGENT_ALLOWED_HOSTS", "intranet.example")  # not told to whoever rebound the name
    refused = app(cid)
    refused.run()
    assert_no_exception(refused)
    shown = texts(refused)
    assert "This page answers only at 127.0.0.1, localhost, ::1" in shown and "AGENT_ALLOWED_HOSTS" in shown
    assert "17*23" not in shown and not refused.chat_input and host.split(":")[0] not in shown
    assert "intranet.example" not in shown
    monkeypatch.setenv("AGENT_ALLOWED_HOSTS", host.split(":")[0])
    allowed = app(cid)
    allowed.run()
    assert "17*23 = 391" in texts(allowed)


@pytest.mark.parametrize("broken", [{"AGENT_JOB_TIMEOUT": "soon"}, {"AGENT_ALLOWED_HOSTS": "bad name!"}],
                         ids=["another-setting", "the-host-list"])
def test_a_configuration_error_is_told_only_under_a_name_the_page_answers_at(monkeypatch, broken):
    from agent.ui import shell

    for name, value in broken.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(shell, "request_host", lambda: "evil.test:8501")
    refused = app()
    refused.run()
    assert_no_exception(refused)
    assert "This page answers only at" in texts(refused) and "not valid" not in texts(refused)
    assert next(iter(broken)) not in texts(refused).replace("AGENT_ALLOWED_HOSTS to", "")
    monkeypatch.setattr(shell, "request_host", lambda: "127.0.0.1:8501")
    told = app()
    told.run()
    assert "The configuration is not valid" in texts(told) and next(iter(broken)) in texts(told)


def test_a_provider_without_its_key_is_refused_in_the_sidebar_unless_its_server_is_on_this_machine(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://models.example.test/v1")
    remote = app()
    remote.run()
    assert remote.selectbox(key="sb_provider").options == ["demo (offline, built in)", "openai", "anthropic"]
    remote.selectbox(key="sb_provider").set_value("openai").run()
    assert_no_exception(remote)
    assert any("OPENAI_API_KEY: is not set" in e.value for e in remote.sidebar.error)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    local = app()
    local.run()
    local.selectbox(key="sb_provider").set_value("openai").run()
    assert_no_exception(local)
    assert not local.sidebar.error
    assert "API key: **not set** · base URL: `http://localhost:11434/v1`" in texts(local)


@pytest.mark.usefixtures("pool")
def test_a_traced_turn_shows_its_trace_id_under_its_clocks(store, queue):
    from opentelemetry.sdk.trace import TracerProvider

    from agent import tracing
    from agent.queue import new_id, submit_turn

    tracing.use_provider(TracerProvider())  # spans go nowhere; the turn still carries its traceparent
    try:
        cid = new_id()
        submit_turn(store, queue, cid, "What is 2+2?", FAST)
    finally:
        tracing.use_provider(None)
    state = wait_done(store, cid)
    trace_id = tracing.trace_id(state["trace_parent"])
    assert trace_id
    at = app(cid).run()
    assert_no_exception(at)
    assert f"OpenTelemetry trace `{trace_id}`" in texts(at)


# -- the text being written (the contract's `live`) and following in real time --------------------


def write_live(store: Store, cid: str, turn_id: str, text: str, *, attempt: int = 1, seq: int = 1,
               from_bytes: int | None = None) -> None:
    head = {"turn_id": turn_id, "message_index": len(store.read(cid)["history"]), "attempt": attempt,
            "status": "writing", "seq": seq}
    assert store.write_live(cid, turn_id, head, text, from_bytes=from_bytes) == "ok"


def test_the_text_being_written_shows_in_the_turn_in_flight_and_grows(store):
    cid, turn_id = make_status(store, "running")
    write_live(store, cid, turn_id, "The answer *so far* is")
    at = app(cid)
    at.run()
    assert_no_exception(at)
    assert "The answer so far is" in texts(at).replace("*", "")
    assert "Writing…" in texts(at)
    write_live(store, cid, turn_id, " 391", from_bytes=len("The answer *so far* is"))
    at.run()
    assert "The answer so far is 391" in texts(at).replace("*", "")


def test_the_text_being_written_is_untrusted_like_any_reply(store):
    cid, turn_id = make_status(store, "running")
    write_live(store, cid, turn_id, "look ![pixel](http://127.0.0.1:9/p.png) <script>x()</script>")
    at = app(cid)
    at.run()
    shown = "\n".join(str(m.value) for m in at.markdown)
    assert "](http://127.0.0.1:9/p.png)" not in shown.replace("\\", "")
    assert "<script>" not in shown


def test_a_retry_shows_only_its_own_text_and_says_it_is_a_new_try(store):
    cid, turn_id = make_status(store, "running")
    write_live(store, cid, turn_id, "first try words")
    write_live(store, cid, turn_id, "second", attempt=2, seq=2)
    at = app(cid)
    at.run()
    assert "second" in texts(at) and "first try words" not in texts(at)
    assert "try 2" in texts(at)


def test_a_stopped_calls_partial_text_shows_on_its_step_and_never_as_the_reply(store):
    cid, turn_id = begin(store)
    doc = running_doc(store, cid)
    doc.update(status="cancelled", current_step=None, ended_at=time.time(),
               error={"kind": "cancelled", "message": "Stopped at your request."})
    store.publish(cid, turn_id, doc, done=True,
                  new_steps=[step(turn_id, 1, "model", "demo", doc["started_at"], attempt=1, outcome="stopped",
                                  partial_text="Half a sente")],
                  summary=turn_summary(turn_id, doc, doc["ended_at"]))
    at = app(cid)
    at.run()
    assert_no_exception(at)
    page = texts(at)
    assert "Half a sente" in page and "cut off" in page
    assert "Stopped" in page


def test_only_the_text_moving_redraws_the_text_alone():
    base = {"turn_id": "t", "status": "running", "done": False, "current_step": {"kind": "model"}, "error": None,
            "history": [{}], "steps": [{}], "live": {"turn_id": "t", "message_index": 1, "attempt": 1, "text": "a"}}
    grown = {**base, "live": {**base["live"], "text": "ab"}}
    assert ui.text_only_change(base, grown)
    assert not ui.text_only_change(base, {**grown, "steps": [{}, {}]}), "a step landed"
    assert not ui.text_only_change(base, {**grown, "live": None, "history": [{}, {}]}), "the message completed"
    assert not ui.text_only_change(base, {**grown, "live": {**grown["live"], "attempt": 2}}), "a retry"
    assert not ui.text_only_change({**base, "live": None}, grown), "the first text of a call"
    assert not ui.text_only_change(base, {**grown, "current_step": {"kind": "tool"}})


def test_a_live_text_of_another_turn_is_not_drawn():
    state = {"turn_id": "now", "done": False, "live": {"turn_id": "before", "text": "old"}}
    assert live_text(state) is None
    assert live_text({**state, "live": {"turn_id": "now", "text": "new"}})["text"] == "new"
    assert live_text({**state, "done": True, "live": {"turn_id": "now", "text": "new"}}) is None


def test_a_page_on_a_conversation_keeps_one_follower_component_ticking_slowly_once_idle(store):
    from agent.ui.follower import IDLE_TICK_MS

    for status in ("running", "done"):
        cid, _ = make_status(store, status)
        at = app(cid)
        at.run()
        ticks = autorefreshes(at)
        assert [t["key"] for t in ticks] == [f"follow-{cid}"], "one component per conversation, kept by the browser"
        assert (ticks[0]["interval"] == IDLE_TICK_MS) is (status == "done")


def test_the_watch_wakes_on_a_write_and_costs_one_blocking_read_at_a_time_while_idle(store):
    from agent.conversation.reads import MAX_BLOCK_MS
    from agent.ui.watch import VersionWatch

    cid, turn_id = make_status(store, "running")
    version = store.version(cid)
    before = store.redis.info("commandstats").get("cmdstat_xread", {}).get("calls", 0)
    watch = VersionWatch(store, cid, version)
    try:
        idle_s = 3.0
        started = time.monotonic()
        assert not watch.wait(idle_s), "nothing was written"
        idle_reads = store.redis.info("commandstats").get("cmdstat_xread", {}).get("calls", 0) - before
        elapsed = time.monotonic() - started
        assert idle_reads <= elapsed / (MAX_BLOCK_MS / 1000) + 1, f"{idle_reads} reads in {elapsed:.1f} s"
        write_ending(store, cid, turn_id, Ending("cancelled", "cancelled", "Stopped."))
        assert watch.wait(5.0), "the ending woke it"
        assert watch.error is None
    finally:
        watch.close()


@pytest.mark.parametrize("status", ["running", "done"])
def test_a_delete_wakes_a_watch_blocked_on_the_conversation_at_once_not_at_the_end_of_its_read(store, status):
    """A regression: a delete removed the event stream, which wakes no blocked reader, so a tab on the
    conversation learned of it only when its read ran out (up to MAX_BLOCK_MS) or at its next check."""
    from agent.conversation.reads import MAX_BLOCK_MS
    from agent.ui.watch import VersionWatch
    from harness.waiting import wait_for

    cid, _ = make_status(store, status)
    watch = VersionWatch(store, cid, store.version(cid))
    try:
        blocked = lambda: any(c.get("cmd") == "xread" for c in store.redis.client_list())  # noqa: E731
        wait_for(blocked, 10, "the watch blocks on the conversation's events")
        deleted = time.monotonic()
        assert store.delete(cid)
        assert watch.wait(MAX_BLOCK_MS / 1000 + 5), "the delete woke it"
        woke_s = time.monotonic() - deleted
        assert woke_s < MAX_BLOCK_MS / 2000, f"woke {woke_s:.2f} s after the delete"
        assert watch.error is None and store.version(cid) is None
    finally:
        watch.close()


def test_a_watched_state_that_turns_unreadable_wakes_the_watch_with_the_reason_not_a_thread_traceback(store):
    from agent.conversation.keys import Keys
    from agent.conversation.well_formed import UnreadableState
    from agent.ui.watch import VersionWatch

    cid, turn_id = make_status(store, "running")
    watch = VersionWatch(store, cid, store.version(cid))
    try:
        # A hostile write: the version stops being a whole number, and the event stream moves.
        store.redis.hset(Keys.of(cid).meta, "version", "7\n")
        store.redis.xadd(Keys.of(cid).events, {"v": "8"})
        assert watch.wait(5.0), "the watch woke"
        assert isinstance(watch.error, UnreadableState)
        watch._thread.join(5.0)
        assert not watch._thread.is_alive(), "the thread ended: nothing left to watch"
    finally:
        watch.close()


def test_a_watch_whose_connection_closes_under_its_blocking_read_wakes_with_an_error_not_a_thread_traceback(store):
    import redis

    from agent.conversation.store import Store
    from agent.ui.watch import VersionWatch
    from harness.waiting import wait_for

    cid, _ = make_status(store, "running")
    pool = store.redis.connection_pool
    own = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class,
                                                           **pool.connection_kwargs))
    watch = VersionWatch(Store(own, ttl_s=600), cid, store.version(cid))
    try:
        wait_for(lambda: any(c.get("cmd") == "xread" for c in store.redis.client_list()), 10,
                 "the watch blocks on the event stream")
        # Closed under the read, not by `close` (again if it fell between two reads and reconnected).
        wait_for(lambda: own.connection_pool.disconnect(inuse_connections=True) or watch.wait(0.5), 10,
                 "the watch woke")
        assert isinstance(watch.error, redis.ConnectionError)
        watch._thread.join(5.0)
        assert not watch._thread.is_alive()
    finally:
        watch.close()
        own.close()


@pytest.mark.usefixtures("pool")
def test_each_model_call_and_the_turn_show_the_tokens_the_provider_reported(store, queue):
    from agent.queue import new_id, submit_turn

    cid = new_id()
    submit_turn(store, queue, cid, "What is 17*23?", FAST)
    state = wait_done(store, cid)
    calls = [s for s in state["steps"] if s["kind"] == "model"]
    assert calls and all(s["usage"]["input_tokens"] > 0 and s["usage"]["output_tokens"] > 0 for s in calls)
    total_in = sum(s["usage"]["input_tokens"] for s in calls)
    total_out = sum(s["usage"]["output_tokens"] for s in calls)
    at = app(cid).run()
    assert_no_exception(at)
    page = texts(at)
    first = calls[0]["usage"]
    assert f"Tokens: {first['input_tokens']:,} in, {first['output_tokens']:,} out." in page
    assert f"Tokens: {total_in:,} in, {total_out:,} out in all." in page


def test_tokens_that_are_not_counts_are_left_out():
    for usage in (None, "12", {"input_tokens": "3"}, {"input_tokens": -1, "output_tokens": True}, []):
        assert render.step_tokens({"usage": usage}) == (None, None)
    assert render.step_tokens({"usage": {"input_tokens": 7}}) == (7, None)
    assert render.tokens_text(7, None) == "Tokens: 7 in"
    assert render.tokens_text(None, None) == ""


# -- issue: hardening, third round ------------------------------------------------------------------


def chart_now_s(at: AppTest) -> float:
    """Where the live timeline draws its now-line, in seconds since the job started."""
    (chart,) = at.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    rules = [layer for layer in spec["layer"] if layer["mark"].get("color") == "#333"]
    return rules[0]["data"]["values"][0]["at_s"]


def budget_used_s(at: AppTest) -> float:
    text = at.progress[0].proto.text
    used = text.split("⏱️ ", 1)[1].split(" used", 1)[0]
    return float(used.removesuffix(" ms")) / 1000 if used.endswith(" ms") else float(used.removesuffix(" s"))


def test_the_live_timelines_now_line_is_the_budget_bars_now_while_a_call_hangs(store, monkeypatch):
    """A regression: the chart was drawn only when a step started or ended, so while a call hung its
    now-line stayed where the call began (1.6 s) as the budget bar went on (5.6 s used)."""
    from agent.ui import follower

    cid, turn_id = make_status(store, "running")
    started_at = store.read(cid)["started_at"]
    clock = iter(started_at + 1.0 + 0.5 * n for n in range(10_000))  # each reading half a second later
    monkeypatch.setattr(ui, "now", lambda: next(clock))
    monkeypatch.setattr(follower, "STATUS_REDRAW_S", 0.05)  # the bridge's hold redraws the bar a few times
    at = app(cid)
    at.run()
    assert_no_exception(at)
    used_s = budget_used_s(at)
    assert used_s >= 2.0, "the budget bar was redrawn during the hold"
    assert chart_now_s(at) == pytest.approx(used_s, abs=0.01)


def test_a_new_chat_shows_the_clock_rules_without_a_code_block_so_its_first_screen_never_waits_for_the_renderer():
    """The browser loads its code renderer (a chunk of its own) when a run first draws a code block, and the
    first screen waited for it (1.7x a minimal chat app's against 1.4x without, side by side in Chromium):
    the header's rules are inline code, and no code block is drawn before there is a step to show."""
    from agent.ui.layout import CLOCK_RULES

    at = app(None)
    at.run()
    assert_no_exception(at)
    assert not at.code
    shown = " ".join(m.value for m in at.markdown)
    assert all(f"`{rule}`" in shown for rule in CLOCK_RULES.splitlines())


def _preload_page():
    from agent.ui import follower

    follower.preload_renderers()


@pytest.mark.parametrize("in_fragment_run", [True, False])
def test_the_code_renderer_is_loaded_hidden_by_a_sessions_first_fragment_run_only(monkeypatch, in_fragment_run):
    """A regression: a tool step that drew the page's first code block showed its Arguments and Result boxes
    empty for 1-2 s while the browser loaded the renderer (measured in Chromium). The follower's first
    fragment run (a new chat's first idle tick) draws one hidden code block; a full run draws none."""
    from agent.ui import follower

    monkeypatch.setattr(follower, "in_fragment_run", lambda: in_fragment_run)
    at = AppTest.from_function(_preload_page, default_timeout=RUN_TIMEOUT_S)
    at.run()
    assert_no_exception(at)
    assert [c.value for c in at.code] == (["{}"] if in_fragment_run else [])
    if in_fragment_run:
        # Its style inside its own place: a style-only st.html goes to the page's event container, where it
        # stayed, marked stale, for as long as a turn was followed.
        assert not at.get("html")
        assert any(f".st-key-{follower.PRELOAD_KEY}" in m.value and "display: none" in m.value for m in at.markdown)
        at.run()  # the same session: loaded once is enough
        assert not at.code
    # Its place is drawn in every run (an empty one once loaded, or in a full run), so what the follower draws
    # after it is at the same place in every run.
    assert len(at.main.children) == 1


# -- issue: the first hour (a dead worker looked alive) -------------------------------------------------------


@pytest.mark.parametrize("beating", [True, False])
def test_a_running_turn_whose_heartbeat_lapsed_says_its_worker_stopped_answering(store, beating, monkeypatch):
    """A regression: after a SIGKILL the status panel went on counting the model call ("5.22 s … 7.24 s of its
    60 s timeout") until the resumed job's note, seconds later. Once the turn's heartbeat lapses, it says so."""
    from agent.turn.heartbeat import ALIVE_MS
    from agent.ui import follower

    monkeypatch.setattr(ui, "lost_worker_check", lambda *args: False)  # its job is made up: not lost, resumed
    cid, turn_id = make_status(store, "running")
    store.publish(cid, turn_id, {**running_doc(store, cid), "current_step": {
        "kind": "model", "name": "demo", "started_at": time.time() - 5.2, "timeout_s": 60.0}})
    if beating:
        store.flags.beat(cid, turn_id, store.read(cid)["job_id"], ALIVE_MS)
    else:  # as a SIGKILL leaves it: its last beat lapsed, and nothing beats again
        from agent.conversation.keys import turn_alive

        live_owner.stop_all()  # the test's own owner would renew the mark at its next beat
        store.flags.client.delete(turn_alive(turn_id))
    at = app(cid)
    at.run()
    assert_no_exception(at)
    page = texts(at)
    counting = "Calling the model (demo)" in page and "of its 60.0 s timeout" in page
    silent = "The worker stopped answering" in page and "resuming the turn on another worker" in page
    assert (counting, silent) == ((True, False) if beating else (False, True)), page[-800:]
    assert at.progress, "the turn's budget bar stays: its clocks still run"
    state = store.read(cid)
    backend = types.SimpleNamespace(store=store)
    silent, look_again_s = follower.worker_silent(backend, state)
    assert silent is not beating
    if beating:  # it looks again when two beats would have been missed, not a whole redraw later
        assert 0 < look_again_s <= (ALIVE_MS - follower.SILENT_LEFT_MS) / 1000
    # Handed over to a new job (the pool's watch, after a lapse) that has not written yet: still silent.
    store.flags.beat(cid, turn_id, "job-resumed", ALIVE_MS)
    assert follower.worker_silent(backend, state)[0]
    # A turn that ends drops its mark with its last write: a state read just before that write is not silent.
    store.publish(cid, turn_id, running_doc(store, cid))
    assert not follower.worker_silent(backend, state)[0]


def _turns_box_page():
    import streamlit as st

    from agent.ui import layout

    box = st.container()
    with box:
        for n in range(st.session_state.setdefault("turns", 3)):
            st.text(f"turn {n}")
        layout._over_what_is_left(box)


def test_a_full_run_draws_over_each_place_of_the_finished_turns_it_no_longer_fills():
    """A regression: a turn answered after it parked was shown twice until the full run that moved it back into
    the follower's frame finished (its place among the finished turns had no element of the new run over it),
    and so were a new chat's examples beside its first turn. Each such place gets an (invisible) empty element."""
    at = AppTest.from_function(_turns_box_page, default_timeout=RUN_TIMEOUT_S)
    at.run()
    assert len(at.main.children[0].children) == 3
    at.session_state["turns"] = 1
    at.run()
    assert [type(e).__name__ for e in at.main.children[0].children.values()] == ["Text", "UnknownElement",
                                                                                 "UnknownElement"]
    at.session_state["turns"] = 2
    at.run()
    assert len(at.main.children[0].children) == 2, "nothing left to cover: the run before drew one"
    at.session_state["turns"] = 0  # another conversation, or a new chat's first turn
    at.run()
    assert len(at.main.children[0].children) == 2
