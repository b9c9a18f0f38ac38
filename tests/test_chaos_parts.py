"""The chaos run's parts that need no fleet: its provider's streamed replies, its seeded plans, the bound each
turn's ending is held to, and the checker's rule for an answer's fresh clocks."""

from __future__ import annotations

import json
from types import SimpleNamespace

from faults.chaos import ChaosOptions, make_plans
from faults.chaos_provider import CHAOS_CALLS, ChaosProvider
from faults.chaos_report import (
    SEEN_DEATH_S,
    Kill,
    TurnPlan,
    TurnResult,
    ending_bound,
    past_job_timeout,
    worker_lost_kind,
)
from faults.checks import check_resumes
from faults.runner import KILL_SLACK_S, WATCH_DETECT_S


class ChunkRecording:
    """An Exchange that records what a chunked action sent, for serving it without a socket."""

    def __init__(self) -> None:
        self.sent = b""

    def send_head(self, status, length, headers) -> None:
        self.status, self.length = status, length

    def send_chunk(self, data: bytes) -> None:
        self.sent += data

    def wait(self, seconds) -> bool:
        return False

    def close_after(self) -> None:
        pass


def test_a_streamed_reply_is_recorded_as_served_only_as_its_last_event_goes_out():
    provider = ChaosProvider(3)
    run = provider.run_log("chaos-1")
    action = provider.action("streamed", run, "chaos-1", 1)
    assert run.served == []
    recording = ChunkRecording()
    action.serve(recording)
    events = [line[len(b"data: "):] for line in recording.sent.split(b"\n\n") if line.startswith(b"data: {")]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events)
    assert run.served == [{"role": "assistant", "content": text}] and text.startswith("answer 1 for chaos-1: w0")
    assert recording.sent.rstrip().endswith(b"data: [DONE]")


def test_the_chaos_provider_draws_only_the_fleets_kinds_and_the_same_for_the_same_seed():
    first, second = ChaosProvider(5), ChaosProvider(5)
    kinds = [first.draw("chaos-2")[0] for _ in range(200)]
    assert kinds == [second.draw("chaos-2")[0] for _ in range(200)]
    assert set(kinds) <= set(CHAOS_CALLS) and {"streamed", "tool_ledger", "hang"} <= set(kinds)


def test_the_plans_are_seeded_and_some_turns_ask_first_some_left_to_expire():
    plans = make_plans(ChaosOptions(turns=400, seed=9))
    assert plans == make_plans(ChaosOptions(turns=400, seed=9)) != make_plans(ChaosOptions(turns=400, seed=10))
    asking = [p for p in plans if p.asks_first]
    assert 60 < len(asking) < 140 and any(p.answer is None for p in asking)
    assert {p.answer for p in asking if p.answer} == {"approved", "denied"}


def _result(job_timeout_at: float, updated_at: float, submitted_at: float = 0.0) -> TurnResult:
    result = TurnResult(TurnPlan(0, False, None, 0.0), "c", "t", "hi", "chaos-0", submitted_at)
    result.observed = [{"job_timeout_at": None, "updated_at": submitted_at},
                       {"job_timeout_at": job_timeout_at, "updated_at": updated_at}]
    return result


def test_an_ending_is_held_to_its_job_timeout_unless_a_kill_or_redis_being_away_explains_it():
    calm = SimpleNamespace(outages=[])
    assert ending_bound(calm, _result(100.0, 99.0), []) == (100.0, "")
    killed_at = 98.0
    bound, why = ending_bound(calm, _result(100.0, 103.0), [Kill(killed_at, "pool", 0, [1])])
    assert bound == killed_at + WATCH_DETECT_S + KILL_SLACK_S and "a kill" in why
    # A worker's death is seen and handed over at once: the ending it explains gets a second, not a lapse's 4 s.
    bound, why = ending_bound(calm, _result(100.0, 103.0), [Kill(killed_at, "worker", 0, [1])])
    assert bound == killed_at + SEEN_DEATH_S + KILL_SLACK_S == 100.0 and "worker 2 s after it" in why
    away = SimpleNamespace(outages=[(90.0, 93.0, "paused 3 s")])
    bound, why = ending_bound(away, _result(100.0, 101.0, submitted_at=80.0), [])
    assert bound > 100.0 + 3.0 and "Redis away 3.0 s" in why
    assert ending_bound(calm, TurnResult(TurnPlan(0, False, None, 0.0), "c", "t", "hi", "m", 0.0,
                                         observed=[{"job_timeout_at": None, "updated_at": 1.0}]), []) == (None, "")


def test_an_ending_after_its_job_timeout_is_counted_by_what_explains_it():
    calm, away = SimpleNamespace(outages=[]), SimpleNamespace(outages=[(90.0, 93.0, "paused 3 s")])
    assert past_job_timeout(calm, _result(100.0, 99.0), []) is None
    assert past_job_timeout(calm, _result(100.0, 101.0), [Kill(98.0, "worker", 0, [1])]) == "after_a_kill"
    assert past_job_timeout(away, _result(100.0, 101.0, submitted_at=80.0), []) == "redis_away"
    assert past_job_timeout(calm, _result(100.0, 101.0), []) == "neither"


def test_an_answers_continuation_may_start_fresh_clocks_but_a_resume_may_not():
    def state(version, status, deadline, attempt=0):
        return {"version": version, "status": status, "deadline_at": deadline, "job_timeout_at": deadline and
                deadline + 1, "attempt": attempt, "steps": [], "turn_id": "t"}

    answered = [state(1, "running", 10.0), state(2, "awaiting_approval", 10.0), state(3, "queued", None),
                state(4, "running", 20.0), state(5, "done", 20.0)]
    assert check_resumes(answered, max_resumes=2) == []
    moved = [state(1, "running", 10.0), state(2, "running", 20.0, attempt=1)]
    assert any("deadline_at changed" in problem for problem in check_resumes(moved, max_resumes=2))


def test_worker_lost_endings_are_told_apart_by_what_stopped_the_hand_over():
    from agent.conversation.endings import Ending

    assert worker_lost_kind(Ending.worker_lost_no_time("it died", 0.0, 0.4).message) == "no time: 0.0 s left"
    assert worker_lost_kind(Ending.worker_lost_no_time("it died", 0.2, 0.4).message) == \
        "no time left before its deadline"
    assert worker_lost_kind(Ending.worker_lost_no_resume("it died", 2).message) == "no resume left"
    assert worker_lost_kind(Ending.worker_lost("its job was taken off the queue by a worker that never started it")
                            .message) == "taken off the queue, never started"
