"""Demo model names -> scenarios: `demo`, `demo:<scenario>`, each with an optional `@<latency_seconds>`
and an optional `~<characters_per_second>` (the rate a streamed reply is written at; 0: all at once).

The name is how a turn's demo settings reach the demo server: it is the one thing every request carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODEL_PREFIX = "demo"
DEFAULT_SCENARIO = "healthy"
# The first impression: each model round-trip visibly takes a moment, so a person sees the tool steps
# land one after the other, and the answer is written at a pace one can read along with.
DEFAULT_LATENCY_S = 0.8  # seconds before each response of the healthy scenario
DEFAULT_STREAM_CPS = 60.0  # characters per second a streamed answer is written at
QUICK_LATENCY_S = 0.05  # seconds; the failure scenarios' default: their point is elsewhere
SLOW_LATENCY_S = 3.0  # seconds; the `slow` scenario's default
MAX_LATENCY_S = 600.0  # seconds; anything longer is a typo, not a demonstration
MAX_STREAM_CPS = 100_000.0  # characters per second; more is "all at once", which 0 says plainly

# Scenario name -> default latency in seconds. `hang` never answers, so its latency is moot.
SCENARIO_LATENCIES_S: dict[str, float] = {
    "healthy": DEFAULT_LATENCY_S,
    "slow": SLOW_LATENCY_S,
    "hang": QUICK_LATENCY_S,
    "flaky": QUICK_LATENCY_S,
    "trickle": QUICK_LATENCY_S,
    "loop": QUICK_LATENCY_S,
    "slow-tool": QUICK_LATENCY_S,
    "verbose": DEFAULT_LATENCY_S,  # answers at great length: what a budget's clamp is for
}


class UnknownModelError(ValueError):
    """The model name is not one the demo server knows (served as a 404 `model_not_found`)."""


@dataclass(frozen=True)
class Scenario:
    """How the demo model behaves for one request: which scenario, how long it sleeps first, and how
    fast it writes a streamed answer (characters per second; 0: all at once)."""

    name: str = DEFAULT_SCENARIO
    latency_s: float = DEFAULT_LATENCY_S
    stream_cps: float = DEFAULT_STREAM_CPS

    @property
    def model_name(self) -> str:
        """The canonical model name that parses back to this scenario."""
        name = MODEL_PREFIX if self.name == DEFAULT_SCENARIO else f"{MODEL_PREFIX}:{self.name}"
        if self.latency_s != SCENARIO_LATENCIES_S[self.name]:
            name += f"@{self.latency_s:g}"
        if self.stream_cps != DEFAULT_STREAM_CPS:
            name += f"~{self.stream_cps:g}"
        return name


def parse_model_name(model: str) -> Scenario:
    """`demo`, `demo@1.0`, `demo:slow`, `demo:flaky@0.2`, `demo@0.8~40` -> Scenario; anything else
    raises UnknownModelError."""
    if not isinstance(model, str):
        raise UnknownModelError(f"The model must be a string, not {type(model).__name__}.")
    rest, tilde, rate_part = model.strip().partition("~")
    name_part, sep, latency_part = rest.partition("@")
    prefix, colon, scenario = name_part.partition(":")
    if prefix != MODEL_PREFIX or (colon and not scenario):
        raise UnknownModelError(f"The model {model!r} does not exist. Try one of: {', '.join(model_names())}.")
    scenario = scenario or DEFAULT_SCENARIO
    if scenario not in SCENARIO_LATENCIES_S:
        raise UnknownModelError(
            f"The demo scenario {scenario!r} does not exist. Try one of: {', '.join(model_names())}."
        )
    latency_s = SCENARIO_LATENCIES_S[scenario]
    if sep:
        try:
            latency_s = float(latency_part)
        except ValueError:
            raise UnknownModelError(f"The latency in {model!r} is not a number of seconds.") from None
        # nan/inf/negative would make the server sleep forever or crash; a bound keeps the demo honest.
        if not math.isfinite(latency_s) or not 0 <= latency_s <= MAX_LATENCY_S:
            raise UnknownModelError(f"The latency in {model!r} must be between 0 and {MAX_LATENCY_S:g} seconds.")
    stream_cps = DEFAULT_STREAM_CPS
    if tilde:
        try:
            stream_cps = float(rate_part)
        except ValueError:
            raise UnknownModelError(f"The writing rate in {model!r} is not a number of characters a second.") from None
        if not math.isfinite(stream_cps) or not 0 <= stream_cps <= MAX_STREAM_CPS:
            raise UnknownModelError(
                f"The writing rate in {model!r} must be between 0 and {MAX_STREAM_CPS:g} characters a second.")
    return Scenario(scenario, latency_s, stream_cps)


def model_names() -> list[str]:
    """Every scenario's model name, as GET /v1/models lists them."""
    return [MODEL_PREFIX] + [f"{MODEL_PREFIX}:{name}" for name in SCENARIO_LATENCIES_S]
