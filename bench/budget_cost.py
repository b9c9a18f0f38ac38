"""What the fourth clock costs a turn: the same four-call turn with the clamp's arithmetic and without it.

"On" is the code as it runs: before each model call the input bound (the request's JSON bytes, or the last
call's count and what was added since), the plan, the spend written with the call's start, the charge after
it. "Off" swaps the plan and its bookkeeping for a constant plan, as if there were no fourth clock. Both
without a budget (the clamp's cost on a turn that has none), then the turn with a budget (max_tokens asked)
against the same turn without one. Each pair back to back in this process, order alternating; ratio = on /
off per pair, median.
"""

from __future__ import annotations

import os
import statistics

from agent.settings import TurnConfig
from agent.spend import CallPlan
from agent.turn import model_calls
from bench.lab import Lab, PoolProcess
from bench.tracing_cost import _turn_s
from harness.stats import summary

BUDGET_TOKENS = 200_000  # a budget the four calls fit in: the turn is the same, with max_tokens asked
OFF_PLAN = CallPlan(10**9, None, 10**9, None)  # no arithmetic, and a bound no count passes (nothing to log)


def clamp_overhead(lab: Lab, pool: PoolProcess, pairs: int, latency_s: float) -> dict:
    os.environ["REDIS_URL"] = lab.url
    os.environ["AGENT_DEMO_URL"] = pool.demo_url
    config = TurnConfig(model=f"demo@{latency_s:g}~0")
    plan, remember = model_calls.ModelCalls.plan, model_calls.ModelCalls.remember

    def turn_s(clamp: bool, turn: TurnConfig = config) -> float:
        if not clamp:
            model_calls.ModelCalls.plan = lambda self, ask: OFF_PLAN
            model_calls.ModelCalls.remember = lambda self, ask, plan, charge: None
        try:
            return _turn_s(lab, turn)[0]
        finally:
            model_calls.ModelCalls.plan, model_calls.ModelCalls.remember = plan, remember

    turn_s(True, TurnConfig(model="demo@0~0"))  # warm: imports, the HTTP session
    on, off = [], []
    for i in range(pairs):
        for clamp in ((True, False) if i % 2 else (False, True)):
            (on if clamp else off).append(turn_s(clamp))
    budgeted, unbudgeted = [], []
    with_budget = config.with_changes(budget_tokens=BUDGET_TOKENS)
    for i in range(pairs):
        for limited in ((True, False) if i % 2 else (False, True)):
            (budgeted if limited else unbudgeted).append(turn_s(True, with_budget if limited else config))
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    budget_ratios = [a / b for a, b in zip(budgeted, unbudgeted, strict=True)]
    return {
        "ratio": round(statistics.median(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "on_s": summary(on, 1, 3),
        "off_s": summary(off, 1, 3),
        "budget_ratio": round(statistics.median(budget_ratios), 4),
        "budget_ratios": [round(r, 4) for r in budget_ratios],
        "budgeted_s": summary(budgeted, 1, 3),
    }
