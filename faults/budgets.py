"""The fourth clock under faults: seeded budgets for a share of the runs, the provider's token counts, and the
figures: turns over budget (the goal is 0), the worst ratio of spent to budget, how each turn ended, and how
tight the input bound is (bound / the input tokens the provider reported, p50 and p95).

A budget run names its usage mode and whether it streams in its model name (`fault-12-ulate-st`), so the
provider (provider.py) knows, for every request: "always" reports usage in a plain reply only, "late" at a
stream's end as well, "asked" at a stream's end only when the request asked (stream_options.include_usage),
"never" not at all. The provider counts tokens as a tokenizer does (agent/demo/tokens.py) and honours
max_tokens, so what it counted is what a provider would bill.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agent.prices import Price, usd_to_pusd
from harness.stats import percentile

USAGE_MODES = ("late", "asked", "never")
FAULT_PRICE = Price(2.0, 0.2, 8.0, 4096, "2026-12-05", "the fault runner's (the demo's list price)")
BUDGET_SHARE = 0.5  # of runs
TOKENS_RANGE = (1000, 40_000)  # a token budget, drawn log-uniform
USD_RANGE = (0.002, 0.1)  # a dollar budget, drawn log-uniform (at FAULT_PRICE: ~250 to ~12,000 output tokens)
ANSWER_WORDS = (0, 0, 30, 300, 1500, 4000)  # extra words an answer may go on for (the clamp cuts what does not fit)


@dataclass(frozen=True)
class BudgetPlan:
    tokens: int | None
    usd: float | None
    usage: str
    streamed: bool

    def model_suffix(self) -> str:
        return f"-u{self.usage}" + ("-st" if self.streamed else "")


def draw(rng: random.Random) -> BudgetPlan | None:
    """A run's budget, or None (no budget) for the other runs."""
    if rng.random() >= BUDGET_SHARE:
        return None
    kind = rng.choices(("tokens", "usd", "both"), weights=(5, 3, 2))[0]
    tokens = round(_log_uniform(rng, *TOKENS_RANGE)) if kind != "usd" else None
    usd = round(_log_uniform(rng, *USD_RANGE), 6) if kind != "tokens" else None
    return BudgetPlan(tokens, usd, rng.choice(USAGE_MODES), rng.random() < 0.5)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def mode_of(model: str) -> tuple[str | None, bool]:
    """(usage mode, streamed) a run's model name asks of the provider; (None, False): not a budget run."""
    usage = next((part[1:] for part in model.split("-") if part[:1] == "u" and part[1:] in USAGE_MODES), None)
    return usage, usage is not None and "-st" in model


def config_changes(plan: BudgetPlan | None) -> dict:
    if plan is None:
        return {}
    return {"budget_tokens": plan.tokens, "budget_usd": plan.usd, "price": FAULT_PRICE.to_dict()}


@dataclass
class BudgetOutcome:
    """One budget run's spend, as its final state says."""

    ratio: float  # spent / budget, the larger of the two budgets' ratios
    over: bool
    ending: str  # "answer", "answer, budget spent", "budget spent", or the error kind
    bound_ratios: list[float]  # input bound / reported input tokens, each call that reported
    later_bound_ratios: list[float]  # the same, calls after a turn's first
    later_tools_bound_ratios: list[float]  # the same, calls after a turn's first that offered tools (not its last)
    charged_below_counted: bool  # charged fewer tokens than the provider counted for the run's requests


def outcome(plan: BudgetPlan, final: dict, counted_tokens: int) -> BudgetOutcome:
    spend = final.get("spend") or {}
    ratios, over = [], False
    if plan.tokens is not None:
        ratios.append((spend.get("tokens") or 0) / plan.tokens)
        over |= (spend.get("tokens") or 0) > plan.tokens
    if plan.usd is not None:
        ratios.append((spend.get("pusd") or 0) / usd_to_pusd(plan.usd))
        over |= (spend.get("pusd") or 0) > usd_to_pusd(plan.usd)
    steps = [s for s in final["steps"] if s.get("kind") == "model" and s.get("turn_id") == final["turn_id"]]
    bounds, later, later_tools = [], [], []
    for number, step in enumerate(steps):
        reported = (step.get("usage") or {}).get("input_tokens")
        if reported and step.get("input_bound"):
            bounds.append(step["input_bound"] / reported)
            if number:
                later.append(step["input_bound"] / reported)
                if not step.get("last_call"):
                    later_tools.append(step["input_bound"] / reported)
    kind = (final.get("error") or {}).get("kind")
    last = (final["history"][-1].get("content") or "") if final["history"] else ""
    if kind:
        ending = "budget spent" if kind == "budget" else kind
    elif last.startswith("The budget for this turn is spent"):
        ending = "answer, budget spent"
    else:
        ending = "answer"
    return BudgetOutcome(max(ratios) if ratios else 0.0, over, ending, bounds, later, later_tools,
                         (spend.get("tokens") or 0) < counted_tokens)


def figures(runs: list[tuple[int, str, BudgetOutcome]]) -> dict:
    """The budget runs' figures; `runs`: (run number, its process fault and note, its outcome)."""
    outcomes = [o for _, _, o in runs]
    bounds = [r for o in outcomes for r in o.bound_ratios]
    later = [r for o in outcomes for r in o.later_bound_ratios]
    later_tools = [r for o in outcomes for r in o.later_tools_bound_ratios]
    endings: dict[str, int] = {}
    for o in outcomes:
        endings[o.ending] = endings.get(o.ending, 0) + 1
    return {
        "budget_runs": len(outcomes),
        "over_budget": sum(o.over for o in outcomes),
        "worst_spent_to_budget": round(max((o.ratio for o in outcomes), default=0.0), 4),
        "spent_to_budget_p50": _round(percentile([o.ratio for o in outcomes], 50)),
        "budget_endings": dict(sorted(endings.items(), key=lambda item: -item[1])),
        "input_bound_over_reported": {"calls": len(bounds), "p50": _round(percentile(bounds, 50)),
                                      "p95": _round(percentile(bounds, 95)), "min": _round(min(bounds, default=None))},
        "input_bound_over_reported_after_first_call": {
            "calls": len(later), "p50": _round(percentile(later, 50)), "p95": _round(percentile(later, 95)),
            "min": _round(min(later, default=None))},
        "input_bound_over_reported_later_with_tools": {
            "calls": len(later_tools), "p50": _round(percentile(later_tools, 50)),
            "p95": _round(percentile(later_tools, 95)), "min": _round(min(later_tools, default=None))},
        "charged_below_counted": sum(o.charged_below_counted for o in outcomes),
        "charged_below_counted_runs": [f"run {index}: {fault}" for index, fault, o in runs if o.charged_below_counted],
    }


def report_lines(report: dict) -> str:
    b, later = report["input_bound_over_reported"], report["input_bound_over_reported_after_first_call"]
    return (f"budgets: {report['budget_runs']} runs with a budget, {report['over_budget']} over it; worst spent / "
            f"budget {report['worst_spent_to_budget']}, p50 {report['spent_to_budget_p50']}; endings "
            f"{report['budget_endings']}; charged less than the provider counted: {report['charged_below_counted']}\n"
            f"input bound / reported input tokens: p50 {b['p50']}, p95 {b['p95']}, min {b['min']} over {b['calls']} "
            f"calls; after a turn's first call p50 {later['p50']}, p95 {later['p95']}, min {later['min']}; of those, "
            f"the calls that offered tools (not a last call, which leaves them out: its bound still counts them) "
            f"p50 {report['input_bound_over_reported_later_with_tools']['p50']}, "
            f"p95 {report['input_bound_over_reported_later_with_tools']['p95']}"
            + "".join(f"\ncharged less than counted: {run}" for run in report["charged_below_counted_runs"]))


def _round(value):
    return None if value is None else round(value, 3)
