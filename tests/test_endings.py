"""One Ending value, one table of words, one turn splitter: pure, no Redis."""

from __future__ import annotations

import json

from rq.timeouts import JobTimeoutException

from agent.contract import ErrorKind, Kind, Outcome, ProviderErrorKind, Role, Status
from agent.conversation import export, words
from agent.conversation.endings import Ending
from agent.conversation.turns import split_turns
from agent.turn.exits import TurnEnded, exit_for


def test_the_queues_job_timeout_has_one_wording_whoever_writes_it():
    # Before: the job said "before it finished" and the failure callback "before it could finish".
    written_by_the_job = exit_for(JobTimeoutException("alarm"), "t1", 30).ending
    assert written_by_the_job == Ending.job_timeout(30)
    assert written_by_the_job.message == "The queue's job timeout (30 s) stopped this turn before it could finish."
    assert (written_by_the_job.status, written_by_the_job.kind) == (Status.TIMED_OUT, ErrorKind.JOB_TIMEOUT)


def test_a_raised_ending_is_written_as_it_was_raised():
    ending = Ending.step_limit(8)
    assert exit_for(TurnEnded(ending), "t1", 30).ending is ending
    assert ending.error == {"kind": "step_limit", "message": ending.message}


def test_an_answer_is_an_ending_without_an_error():
    assert Ending.answered().status == Status.DONE and Ending.answered().error is None


def test_a_timed_out_model_call_runs_the_turn_out_of_time_and_any_other_failure_fails_it():
    assert Ending.call_failed(ProviderErrorKind.TIMEOUT, "no answer").status == Status.TIMED_OUT
    assert Ending.call_failed(ProviderErrorKind.SERVER, "HTTP 503").status == Status.FAILED


def test_statuses_and_kinds_are_stored_as_plain_json_strings():
    values = [Status.DONE, ErrorKind.WORKER_LOST, ProviderErrorKind.AUTH, Kind.MODEL, Outcome.OK, Role.USER]
    assert json.dumps(values) == '["done", "worker_lost", "auth", "model", "ok", "user"]'
    assert json.dumps(Ending.cancelled().error) == '{"kind": "cancelled", "message": "Stopped at your request."}'
    assert Status("timed_out") == "timed_out" and {"done": 1}[Status.DONE] == 1


def test_every_status_has_its_words_and_only_an_answer_exits_zero():
    for status in Status:
        assert status in words.STATUS_WORDS
    assert words.STATUS_LABELS[Status.DONE] == "✅ Answered"
    assert [words.exit_status(s) for s in (Status.DONE, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED)] == [
        0, 1, 1, 1]
    assert words.exit_status("not a status") == 1


def test_the_export_and_the_page_cut_turns_alike():
    state = {"conversation_id": "c", "turn_id": "t2", "done": True, "status": "failed", "updated_at": 1.7e9,
             "error": {"kind": "deadline", "message": "late"},
             "history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
                         {"role": "user", "content": "b"}, {"role": "assistant", "content": "late"}],
             "steps": [], "turns": [{"turn_id": "t1", "status": "done", "error": None, "ended_at": 1.6e9}]}
    turns = split_turns(state)
    assert [(t.summary["status"], t.current, t.in_flight, t.ended_at) for t in turns] == [
        ("done", False, False, 1.6e9), ("failed", True, False, 1.7e9)]
    markdown = export.to_markdown(state)
    assert "*Ending: answered at 2020-09-13" in markdown and "*Ending: failed (deadline) at 2023-11-14" in markdown
