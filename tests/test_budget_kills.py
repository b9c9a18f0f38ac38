"""The fourth clock where it meets a lost worker: the kill swept across every point of a budgeted turn's
model calls, and none leaves a billed call uncharged or the budget overshot.

Each case SIGKILLs the worker at one point of one of the turn's three calls (two of a tool, then the answer):
as the request reaches the model (counted there, no reply yet), just before its reply's last byte (the call
cut), and 5, 20 and 60 ms after its reply (its charge in memory or being published, its tool running, the
next call starting, or the final write: a kill that finds the turn ended kills nothing); with the model
reporting its usage and without (charged at the worst case). Every turn must end `done` with every tool call
answered once, its spend at least every token the model counted (what a provider bills), nothing left in
flight, and within its budget; a killed one after a resume.

Real Redis (this test's own), a real pool, a model on loopback that counts tokens as a tokenizer does
(harness/token_model.py); the cases run side by side.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

import pytest

from agent.contract import Status
from harness.token_model import TokenModel
from harness.waiting import wait_for
from tests.conftest import ask, wait_done
from tests.test_budget import ANSWER, call, config_for
from tests.test_resume import assert_every_call_answered_once, worker_running, workers  # noqa: F401 (a fixture)

CALLS = 3  # the turn's model calls: two ask for a tool, the third answers
POINTS = ("request", "reply", "reply+0.005", "reply+0.02", "reply+0.06")
BUDGET_TOKENS = 60_000  # room for the lost call's worst case and the calls after the resume
WORKERS = 6
TURN_S = 60.0  # seconds a case may take, with the others beside it


@dataclass
class Case:
    call: int  # 1..CALLS: the call whose point kills the worker
    point: str
    usage: str
    model: TokenModel | None = None
    cid: str | None = None
    killed: int | None = None  # the pid killed; 0: the turn had ended (a point past its final write)
    killed_at: float = 0.0

    def kill(self, private_redis) -> None:
        """SIGKILL the worker running this case's turn, once; none when the turn has ended."""
        if self.killed is not None:
            return
        wait_for(lambda: self.cid is not None, 5.0, "the case's conversation id")

        def running_or_ended():  # RQ's registry may lag a busy worker: looked at until one or the other
            found = worker_running(private_redis.queue_connection, self.cid)
            return found or ((private_redis.store.read_meta(self.cid) or {}).get("done") and (0, ""))

        pid, _ = wait_for(running_or_ended, 5.0, "the worker running the turn, or its end")
        self.killed = pid
        if pid:
            self.killed_at = time.time()
            os.kill(pid, signal.SIGKILL)

    def hooks(self, private_redis) -> dict:
        number = self.call - 1
        if self.point == "request":
            return {"on_request": lambda index: index == number and self.kill(private_redis)}
        after_s = float(self.point.partition("+")[2] or 0)

        def on_reply(index: int) -> None:
            if index != number or self.killed is not None:
                return
            if not after_s:
                self.kill(private_redis)
                return
            threading.Timer(after_s, self.kill, (private_redis,)).start()

        return {"on_reply": on_reply}


def turn_summary(final: dict) -> dict:
    return next(t for t in final["turns"] if t["turn_id"] == final["turn_id"])


CASES = [Case(n, point, usage) for n in range(1, CALLS + 1) for point in POINTS for usage in ("always", "never")]


@pytest.mark.slow
def test_a_kill_at_any_point_of_a_budgeted_turn_leaves_no_billed_call_uncharged(private_redis, workers):  # noqa: F811
    workers(WORKERS)
    replies = [call(1, "17*23"), call(2, "391+9"), ANSWER]
    cases = [Case(c.call, c.point, c.usage) for c in CASES]
    try:
        for case in cases:
            case.model = TokenModel(replies, usage=case.usage, **case.hooks(private_redis))
        for index, case in enumerate(cases):
            config = config_for(case.model, budget_tokens=BUDGET_TOKENS, job_timeout_s=20, deadline_margin_s=3.0,
                                call_timeout_cap_s=5.0)
            case.cid = ask(private_redis.store, private_redis.queue, f"case {index}: what is 17*23, plus 9?", config)
        finals = [wait_done(private_redis.store, case.cid, timeout_s=TURN_S) for case in cases]
    finally:
        time.sleep(0.4)  # the last timers fire (each kills at most once)
        for case in cases:
            if case.model is not None:
                case.model.stop()
    for case, final in zip(cases, finals, strict=True):
        name = f"call {case.call} at {case.point}, usage {case.usage}"
        assert case.killed is not None, f"{name}: its point never came"
        assert final["status"] == Status.DONE, (name, final["status"], final["error"], final["history"][-1])
        # Killed: resumed, unless its final write had landed (RQ still names the job for a moment after it).
        ended_first = turn_summary(final)["ended_at"] <= case.killed_at
        assert final["attempt"] >= 1 or not case.killed or ended_first, f"{name}: not resumed"
        assert_every_call_answered_once(final["history"])
        counted = sum(c.input_tokens + c.output_tokens for c in case.model.counted)
        spend = final["spend"]
        assert spend["tokens"] >= counted, f"{name}: charged {spend['tokens']}, the model counted {counted}"
        assert spend["in_flight_tokens"] == 0, name
        assert spend["tokens"] <= BUDGET_TOKENS, name
    # The sweep did kill: at every request and reply, and after replies too (where the turn's rest, quick tools and
    # the next calls, may have ended it already).
    kills = str([(c.call, c.point, c.killed) for c in cases])
    assert all(case.killed for case in cases if case.point in ("request", "reply")), kills
    assert any(case.killed for case in cases if "+" in case.point and case.call < CALLS), kills
