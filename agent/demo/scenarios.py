"""Demo model names -> scenarios: `demo`, `demo:<scenario>`, each with an optional `@<latency_seconds>`."""

from __future__ import annotations

import math
from dataclasses import dataclass

MODEL_PREFIX = "demo"
DEFAULT_SCENARIO = "healthy"
DEFAULT_LATENCY_S = 0.05  # seconds before each response, so calls take a visible but tiny time
SLOW_LATENCY_S = 3.0  # seconds; the `slow` scenario's default
MAX_LATENCY_S = 600.0  # seconds; anything longer is a typo, not a demonstration

# Scenario name -> default latency in seconds. `hang` never answers, so its latency is moot.
SCENARIO_LATENCIES_S: dict[str, float] = {
    "healthy": DEFAULT_LATENCY_S,
    "slow": SLOW_LATENCY_S,
    "hang": DEFAULT_LATENCY_S,
    "flaky": DEFAULT_LATENCY_S,
    "trickle": DEFAULT_LATENCY_S,
    "loop": DEFAULT_LATENCY_S,
    "slow-tool": DEFAULT_LATENCY_S,
}


class UnknownModelError(ValueError):
    """The model name is not one the demo server knows (served as a 404 `model_not_found`)."""


@dataclass(frozen=True)
class Scenario:
    """How the demo model behaves for one request: which scenario, and how long it sleeps first."""

    name: str = DEFAULT_SCENARIO
    latency_s: float = DEFAULT_LATENCY_S

    @property
    def model_name(self) -> str:
        """The canonical model name that parses back to this scenario."""
        base = MODEL_PREFIX if self.name == DEFAULT_SCENARIO else f"{MODEL_PREFIX}:{self.name}"
        if self.latency_s == SCENARIO_LATENCIES_S[self.name]:
            return base
        return f"{base}@{self.latency_s:g}"


def parse_model_name(model: str) -> Scenario:
    """`demo`, `demo@1.0`, `demo:slow`, `demo:flaky@0.2` -> Scenario; anything else raises UnknownModelError."""
    if not isinstance(model, str):
        raise UnknownModelError(f"The model must be a string, not {type(model).__name__}.")
    name_part, sep, latency_part = model.strip().partition("@")
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
    return Scenario(scenario, latency_s)


def model_names() -> list[str]:
    """Every scenario's model name, as GET /v1/models lists them."""
    return [MODEL_PREFIX] + [f"{MODEL_PREFIX}:{name}" for name in SCENARIO_LATENCIES_S]
