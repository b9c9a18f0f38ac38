"""Faults: the seeded fault runner on a CI-sized sample, its checker, duplicates and lost workers."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from rq.serializers import JSONSerializer

from agent.conversation.endings import Ending, write_ending
from agent.hosting.lost_worker import lost_worker_check
from agent.queue import JOB_FUNCTION, SafeJob, job_id_for, new_id, submit_turn
from agent.runtime.loopback_server import Hang, Request
from agent.turn.tool_runs import UNANSWERED_CALL_RESULT
from faults.checks import check_observations
from faults.ledger import ledger_problems, read_ledger
from faults.provider import CALL_FAULTS, FaultProvider
from faults.runner import Options, run_faults
from harness.waiting import wait_for
from tests.conftest import FAST, wait_done
from tests.scripted_server import chat_reply, tool_call

CI_RUNS = 100  # the CI-sized sample; `make faults` runs 1,000


def scripted_config(server, **changes):
    return FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1", **changes)


# -- the fault provider, without sockets -------------------------------------------------------


class Recording:
    """An Exchange that records what an action sent, for serving actions without a socket."""

    def __init__(self) -> None:
        self.sent = b""

    def send_head(self, status, length, headers) -> None:
        self.status = status

    def write(self, data: bytes) -> None:
        self.sent += data

    def wait(self, seconds) -> bool:
        return False

    def reset(self) -> None:
        self.sent += b"<RST>"

    def close_after(self) -> None:
        pass


def _call(provider: FaultProvider, model: str):
    return provider(Request("POST", "/v1/chat/completions", body=json.dumps({"model": model}).encode()))


def test_the_fault_provider_draws_the_same_faults_for_the_same_seed():
    first, second = FaultProvider(7), FaultProvider(7)
    for _ in range(30):
        assert _call(first, "fault-1") == _call(second, "fault-1")
    assert first.runs["fault-1"].faults == second.runs["fault-1"].faults
    assert first.runs["fault-1"].calls == 30


def test_a_reply_is_recorded_as_served_only_once_it_is_sent_in_full():
    provider = FaultProvider(1)
    run = provider.run_log("fault-3")
    for count, kind in enumerate(("answer", "tool_ok", "trickle")):
        action = provider.action(kind, run, "fault-3", 1)
        assert len(run.served) == count  # drawn, not yet sent
        recording = Recording()
        action.serve(recording)
        assert json.loads(recording.sent)["choices"][0]["message"] == run.served[-1]
    assert len(run.served) == 3


def test_a_budget_runs_reply_is_counted_cut_at_its_max_tokens_and_its_usage_reported_as_its_mode_says():
    from agent.demo import tokens
    from faults import budgets

    provider = FaultProvider(seed=5)
    request = {"model": "fault-9-unever", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 40}
    for number in range(1, 30):
        run = provider.run_log(request["model"])
        action = provider.action("answer", run, request["model"], number, request)
        recording = Recording()
        action.serve(recording)
        body = json.loads(recording.sent)
        assert "usage" not in body, "never reports usage"
        assert tokens.reply_tokens(body["choices"][0]["message"]) <= 40
    assert run.counted_tokens > 0
    assert budgets.mode_of("fault-3-uasked-st-slow") == ("asked", True)
    assert budgets.mode_of("fault-3-slow") == (None, False)


def test_every_call_fault_is_an_action():
    provider = FaultProvider(1)
    run = provider.run_log("fault-0")
    for kind in CALL_FAULTS:
        assert hasattr(provider.action(kind, run, "fault-0", 1), "serve"), kind
    assert isinstance(provider.action("hang", run, "fault-0", 1), Hang)
    recording = Recording()
    provider.action("reset_mid_body", run, "fault-0", 1).serve(recording)
    assert recording.sent.endswith(b"<RST>") and recording.status == 200
    assert _call(provider, "fault-0").serve is not None  # a request without a body is drawn for too


# -- the runner ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_ci_sample_of_fault_runs_keeps_every_promise():
    out = io.StringIO()
    report = run_faults(Options(runs=CI_RUNS, seed=20240, concurrency=4), out=out)
    assert report["runs"] == CI_RUNS
    assert report["stuck"] == 0, out.getvalue()
    assert report["invariant_violations"] == 0, out.getvalue()
    assert report["canary_leaks"] == []
    # The sample really did hit the process faults, and the turns ended every way there is.
    assert report["hard_kills"] + report["sigterms"] + report["redis_pauses"] + report["redis_restarts"] >= 5
    assert {"done", "failed", "timed_out"} <= set(report["statuses"])
    assert report["final_minus_job_timeout_max_unkilled_s"] < 0  # unkilled turns end before the queue's kill
    # Resumes are counted, and the checker's resume invariants held (they are among the violations above):
    # no attempt past max_resumes, clocks never changed, one result and one run per tool call. A hard-killed
    # run's clocks leave room to resume wherever the kill lands: most of them resume.
    max_resumes = Options().clocks.max_resumes
    assert all(int(attempt) <= max_resumes for attempt in report["attempts"]), report["attempts"]
    assert report["resumed_turns"] == sum(n for a, n in report["attempts"].items() if int(a) > 0)
    assert report["resume_steps"] <= sum(int(a) * n for a, n in report["attempts"].items())
    assert report["resumed_turns_after_hard_kill"] <= report["hard_kills"]
    if report["hard_kills"]:
        assert report["hard_killed_done_share"] == round(report["hard_killed_done"] / report["hard_kills"], 3)
        assert report["resumed_turns_after_hard_kill"] >= report["hard_kills"] / 2, report["hard_killed_statuses"]
    # Side effects among batched quick tools, some cut by the kills: none ran twice, none reported run unwritten.
    assert report["ledger_runs"] >= 1 and report["ledger_entries"] >= 1
    assert report["ledger_twice"] == [] and report["ledger_results_unwritten"] == []
    assert "resumed turns" in out.getvalue() and "hard-killed turns ended done" in out.getvalue()
    # The fourth clock: half the runs have a budget, and none spent past it (an overshoot is a violation too).
    assert report["budget_runs"] >= CI_RUNS / 4 and report["over_budget"] == 0
    assert report["worst_spent_to_budget"] <= 1.0
    assert report["input_bound_over_reported"]["min"] >= 1.0, "an input bound below what the provider counted"
    assert report["charged_below_counted"] == 0, out.getvalue()
    assert "budgets:" in out.getvalue() and "input bound / reported input tokens" in out.getvalue()


def test_the_ledger_check_finds_a_side_effect_run_twice(tmp_path):
    path = tmp_path / "ledger.txt"
    path.write_text("t1:c1 a\nt1:c2 b\nt1:c1 a\n")
    lines = read_ledger(path)
    assert lines == [("t1:c1", "a"), ("t1:c2", "b"), ("t1:c1", "a")]
    assert ledger_problems(lines) == ["the ledger call t1:c1 ran 2 times"]
    assert ledger_problems(lines[:2]) == [] and read_ledger(tmp_path / "none") == []


# -- the checker finds what it is meant to find -----------------------------------------------


def _state(version, history, done=False, status="running", error=None, turn_id="t1"):
    return {"version": version, "history": history, "done": done, "status": status, "error": error,
            "turn_id": turn_id}


USER = {"role": "user", "content": "hi"}
ANSWER = {"role": "assistant", "content": "answer 1 for m"}


def test_the_checker_accepts_a_clean_turn():
    observed = [_state(1, [USER]), _state(2, [USER, ANSWER], done=True, status="done")]
    assert check_observations(observed, turn_id="t1", user_text="hi", served=[ANSWER]) == []


def test_the_checker_reports_done_reverting_and_a_history_that_is_not_a_prefix():
    observed = [
        _state(1, [USER]),
        _state(2, [USER, ANSWER], done=True, status="done"),
        _state(3, [{"role": "user", "content": "other"}], done=False),
    ]
    problems = check_observations(observed, turn_id="t1", user_text="hi", served=[ANSWER])
    assert any("done reverted" in p for p in problems)
    assert any("does not extend" in p for p in problems)
    assert any("after done" in p for p in problems)


def test_the_checker_reports_duplicated_messages_and_tool_answers():
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    asking = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "2"}
    history = [USER, USER, asking, result, result, ANSWER, ANSWER]
    problems = check_observations([_state(5, history, done=True, status="done")], turn_id="t1",
                                  user_text="hi", served=[asking, ANSWER])
    assert any("user messages" in p for p in problems)
    assert any("answered more than once" in p for p in problems)
    assert any("never sent" in p for p in problems)


def test_the_checker_reports_an_unanswered_tool_call_unless_the_worker_was_lost():
    call = {"id": "c1", "type": "function", "function": {"name": "wait", "arguments": "{}"}}
    asking = {"role": "assistant", "content": None, "tool_calls": [call]}
    ending = {"role": "assistant", "content": "lost"}
    for kind, expected in (("internal", True), ("worker_lost", False)):
        final = _state(3, [USER, asking, ending], done=True, status="failed",
                       error={"kind": kind, "message": "lost"})
        problems = check_observations([final], turn_id="t1", user_text="hi", served=[asking])
        assert any("never answered" in p for p in problems) is expected


def _asking(*call_ids, name="calculator"):
    calls = [{"id": c, "type": "function", "function": {"name": name, "arguments": "{}"}} for c in call_ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def test_the_checker_reports_an_attempt_past_max_resumes_and_clocks_that_moved():
    first = {**_state(1, [USER]), "attempt": 0, "deadline_at": 10.0, "job_timeout_at": 11.5}
    resumed = {**_state(2, [USER]), "attempt": 3, "deadline_at": 12.0, "job_timeout_at": 11.5}
    final = {**_state(3, [USER, ANSWER], done=True, status="done"), "attempt": 3, "deadline_at": 12.0,
             "job_timeout_at": 11.5}
    problems = check_observations([first, resumed, final], turn_id="t1", user_text="hi", served=[ANSWER],
                                  max_resumes=2)
    assert any("more than max_resumes=2" in p for p in problems)
    assert [p for p in problems if "deadline_at changed" in p] == ["deadline_at changed at version 2: 10.0 -> 12.0"]
    assert not any("job_timeout_at" in p for p in problems)
    back = {**_state(4, [USER, ANSWER], done=True, status="done"), "attempt": 1}
    assert any("attempt went back" in p for p in check_observations([final, back], turn_id="t1", user_text="hi",
                                                                    served=[ANSWER]))


def test_the_checker_accepts_a_resumed_turn_and_reports_a_resume_step_twice():
    step = {"turn_id": "t1", "kind": "resume", "attempt": 1, "name": "worker lost: resume 1"}
    ok = {**_state(3, [USER, ANSWER], done=True, status="done"), "attempt": 1, "steps": [step]}
    assert check_observations([ok], turn_id="t1", user_text="hi", served=[ANSWER], max_resumes=2) == []
    twice = {**ok, "steps": [step, step]}
    problems = check_observations([twice], turn_id="t1", user_text="hi", served=[ANSWER], max_resumes=2)
    assert any("resume step recorded twice" in p for p in problems)


def test_the_checker_reports_a_tool_run_twice_or_not_run_again_though_safe():
    asking = _asking("c1")
    lost = {"role": "tool", "tool_call_id": "c1",
            "content": "Error: the worker was lost while this tool ran, and the tool was not run again."}
    run = {"turn_id": "t1", "kind": "tool", "call_id": "c1", "name": "calculator"}
    final = {**_state(4, [USER, asking, lost, ANSWER], done=True, status="done"), "attempt": 1,
             "steps": [run, run]}
    problems = check_observations([final], turn_id="t1", user_text="hi", served=[asking, ANSWER])
    assert any("recorded as run more than once" in p for p in problems)
    assert any("not run again after a lost worker, though safe to repeat" in p for p in problems)
    # A tool that is not safe to repeat (an unknown name here) may get that answer, in a resumed turn only.
    unsafe = _asking("c1", name="rm_rf")
    final = {**_state(4, [USER, unsafe, lost, ANSWER], done=True, status="done"), "attempt": 1, "steps": [run]}
    assert check_observations([final], turn_id="t1", user_text="hi", served=[unsafe, ANSWER]) == []
    never = {**final, "attempt": 0}
    assert any("never resumed" in p for p in check_observations([never], turn_id="t1", user_text="hi",
                                                                served=[unsafe, ANSWER]))


def test_the_checker_allows_only_the_last_responses_calls_unanswered_after_a_lost_worker():
    first, second = _asking("c1"), _asking("c2")
    ending = {"role": "assistant", "content": "lost"}
    error = {"kind": "worker_lost", "message": "lost"}
    cut_last = _state(4, [USER, first, {"role": "tool", "tool_call_id": "c1", "content": "4"}, second, ending],
                      done=True, status="failed", error=error)
    assert check_observations([cut_last], turn_id="t1", user_text="hi", served=[first, second]) == []
    cut_earlier = _state(4, [USER, first, second, ending], done=True, status="failed", error=error)
    problems = check_observations([cut_earlier], turn_id="t1", user_text="hi", served=[first, second])
    assert any("never answered before a later model call: ['c1']" in p for p in problems)


# -- lost workers and duplicates, against real workers ----------------------------------------


def _begin(store, cid, tid, enqueued_at=None):
    doc = {"status": "queued", "error": None, "config": FAST.to_dict(), "job_id": job_id_for(tid),
           "enqueued_at": enqueued_at or time.time(), "deadline_at": None, "job_timeout_at": None,
           "started_at": None, "current_step": None}
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, doc)


def test_a_worker_lost_before_its_first_write_is_still_detected_and_its_turn_queued_again(store, redis_client):
    # Regression: a job killed after RQ started it but before its first state write left no
    # job_timeout_at in the state, and the front end's lost-worker check never fired. Then it fired, and ended
    # the turn, which had not begun: now it is queued again, once, on the clocks it was sent with.
    cid, tid = "lost-early-" + new_id(), new_id()
    _begin(store, cid, tid, enqueued_at=time.time() - 30)
    job = SafeJob.create(JOB_FUNCTION, args=(cid, tid), connection=redis_client, serializer=JSONSerializer,
                         id=job_id_for(tid), timeout=FAST.job_timeout_s)
    job.started_at = datetime.now(UTC) - timedelta(seconds=FAST.job_timeout_s + 10)
    job.save()
    redis_client.hset(job.key, "status", "started")  # as RQ leaves it when a SimpleWorker is SIGKILLed
    assert lost_worker_check(store, redis_client, cid) is False  # no ending: handed over
    assert lost_worker_check(store, redis_client, cid) is False  # once: the second look finds it handed over
    state = store.read_meta(cid)
    assert not state["done"] and state["attempt"] == 1 and state["job_id"] == f"{job_id_for(tid)}-resume-1"
    again = SafeJob.fetch(state["job_id"], connection=redis_client, serializer=JSONSerializer)
    assert again.timeout == FAST.job_timeout_s  # the whole job timeout: it counts from the new job's start


def test_with_no_resume_left_a_turn_lost_before_its_first_write_says_why_it_ended(store, redis_client):
    cid, tid = "lost-early-" + new_id(), new_id()
    _begin(store, cid, tid, enqueued_at=time.time() - 30)
    store.publish(cid, tid, {"config": FAST.with_changes(max_resumes=0).to_dict(), "status": "queued",
                             "job_id": job_id_for(tid), "enqueued_at": time.time() - 30})
    job = SafeJob.create(JOB_FUNCTION, args=(cid, tid), connection=redis_client, serializer=JSONSerializer,
                         id=job_id_for(tid), timeout=FAST.job_timeout_s)
    job.started_at = datetime.now(UTC) - timedelta(seconds=10)
    job.save()
    redis_client.hset(job.key, "status", "started")
    assert lost_worker_check(store, redis_client, cid) is True
    state = store.read(cid)
    assert state["done"] and state["status"] == "failed" and state["error"]["kind"] == "worker_lost"
    assert "were left" not in state["error"]["message"], state["error"]["message"]


def test_a_started_job_within_its_time_is_not_declared_lost(store, redis_client):
    cid, tid = "not-lost-" + new_id(), new_id()
    _begin(store, cid, tid, enqueued_at=time.time() - 30)
    job = SafeJob.create(JOB_FUNCTION, args=(cid, tid), connection=redis_client, serializer=JSONSerializer,
                         id=job_id_for(tid), timeout=FAST.job_timeout_s)
    job.started_at = datetime.now(UTC)
    job.save()
    redis_client.hset(job.key, "status", "started")
    assert lost_worker_check(store, redis_client, cid) is False
    assert not store.read(cid)["done"]


@pytest.mark.usefixtures("pool")
def test_a_job_that_runs_again_after_its_first_run_crashed_writes_nothing(store, queue, scripted):
    # The first run claimed the turn and died; RQ (or anyone) running the job again must not
    # produce a second reply: it finds the claim, calls no model and writes nothing.
    cid, tid = "rerun-" + new_id(), new_id()
    scripted.add(chat_reply("a second reply that must never be asked for"))
    config = scripted_config(scripted)
    doc = {"status": "queued", "error": None, "config": config.to_dict(), "job_id": job_id_for(tid),
           "enqueued_at": time.time(), "deadline_at": None, "job_timeout_at": None, "started_at": None,
           "current_step": None}
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, doc)
    assert store.claim_turn(tid, "turn-first-run", ttl_s=60)
    before = store.read(cid)["version"]
    job = queue.enqueue(JOB_FUNCTION, cid, tid, job_id=job_id_for(tid), job_timeout=config.job_timeout_s)
    wait_for(lambda: job.get_status(refresh=True).value in ("finished", "failed"), 10, "the second run ends")
    assert job.return_value() == "duplicate"
    assert scripted.requests == []
    assert store.read(cid)["version"] == before


@pytest.mark.usefixtures("pool")
def test_a_turn_after_a_lost_worker_sends_the_model_an_answer_for_every_tool_call(store, queue, scripted):
    # Regression: a turn lost mid-tool left an assistant tool call without a result, and every
    # later turn in that conversation sent a history that OpenAI and Anthropic refuse (HTTP 400).
    cid, tid = "orphan-" + new_id(), new_id()
    _begin(store, cid, tid)
    call = tool_call("wait", {"seconds": 30}, call_id="call_lost")
    store.publish(cid, tid, {"status": "running"}, new_messages=[{"role": "assistant", "content": None,
                                                                  "tool_calls": [call]}])
    assert write_ending(store, cid, tid, Ending("failed", "worker_lost", "The worker was lost."))
    scripted.add(chat_reply("fine"))
    submit_turn(store, queue, cid, "and now?", scripted_config(scripted))
    state = wait_done(store, cid)
    assert state["status"] == "done"
    sent = scripted.requests[0].json["messages"]
    asked = [c["id"] for m in sent for c in m.get("tool_calls") or []]
    answers = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert asked == ["call_lost"]
    assert answers == {"call_lost": UNANSWERED_CALL_RESULT}
    # The stored chat is unchanged: the synthetic answer exists only in what the model sees.
    assert all(m["role"] != "tool" for m in state["history"])


# -- a write that timed out but landed --------------------------------------------------------


def _writer(store, cid, tid):
    from agent.turn.writer import StateWriter

    return StateWriter(store, cid, tid, {"status": "running"}, persisted_len=1, clock=time.time)


def test_a_write_that_timed_out_but_landed_does_not_end_the_job(store, monkeypatch):
    # Regression: Redis paused past the client's socket timeout runs the write when it resumes;
    # the retry then found the history "moved" (CONFLICT) and the job gave the turn up, so the
    # ending came only from the lost-worker check, after the job timeout.
    import redis

    cid, tid = "landed-" + new_id(), new_id()
    _begin(store, cid, tid)
    writer = _writer(store, cid, tid)
    real_publish = store.publish

    def lands_then_times_out(*args, **kwargs):
        monkeypatch.setattr(store, "publish", real_publish)
        real_publish(*args, **kwargs)  # Redis ran it...
        raise redis.TimeoutError("...after the client had given up on it")

    monkeypatch.setattr(store, "publish", lands_then_times_out)
    writer.add_message({"role": "assistant", "content": "answer"})
    writer.add_step("model", "m", time.time(), "ok")
    writer.flush()  # times out, yet landed
    writer.add_message({"role": "tool", "tool_call_id": "c1", "content": "more"})
    writer.add_step("tool", "t", time.time(), "ok")
    writer.flush()  # finds its own messages there: carries on, sending only what is new
    assert writer.persisted_len == 3 and writer.pending_messages == [] and writer.pending_steps == []
    writer.add_message({"role": "assistant", "content": "done"})
    writer.flush(done=True)
    state = store.read(cid)
    assert [m["content"] for m in state["history"]] == ["hi", "answer", "more", "done"]
    assert [s["name"] for s in state["steps"]] == ["m", "t"]  # no step written twice
    assert state["done"]


def test_a_history_moved_by_someone_else_still_closes_the_turn(store):
    from agent.turn.exits import TurnClosed

    cid, tid = "moved-" + new_id(), new_id()
    _begin(store, cid, tid)
    writer = _writer(store, cid, tid)
    store.publish(cid, tid, writer.doc, new_messages=[{"role": "assistant", "content": "not mine"}])
    writer.add_message({"role": "assistant", "content": "mine"})
    with pytest.raises(TurnClosed):
        writer.flush()


def test_a_job_taken_off_the_queue_by_a_worker_that_died_is_found_and_queued_again(store, redis_client, monkeypatch):
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from agent.hosting import lost_worker as watch

    monkeypatch.setattr(watch, "LIMBO_GRACE_S", 0.3)
    cid, tid = new_id(), new_id()
    job_id = f"turn-{tid}"
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"},
                     {"status": "queued", "job_id": job_id, "enqueued_at": time.time()})
    # Queued in RQ's eyes, but in no queue: what a worker killed between dequeue and start leaves.
    job = Job.create("agent.turn.run_turn", args=(cid, tid), id=job_id, connection=redis_client,
                     serializer=JSONSerializer, status="queued")
    job.save()
    assert watch.lost_reason(store, redis_client, cid) is None  # the first sighting starts the clock
    time.sleep(0.5)
    assert "never started" in watch.lost_reason(store, redis_client, cid)
    # Its turn never began: it is queued again (once), not ended.
    assert not watch.lost_worker_check(store, redis_client, cid)
    state = store.read_meta(cid)
    assert not state["done"] and state["attempt"] == 1 and state["job_id"] == f"{job_id}-resume-1"
