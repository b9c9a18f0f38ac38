"""What a model's tokens cost: the shipped list prices, and AGENT_PRICES, a file that overrides or adds to them.

A price is US dollars per million input, cached-input and output tokens, kept exactly: arithmetic on
money is done in whole picodollars (10^-12 USD, `pusd`), so a budget's comparisons never round the wrong
way. A model without a price can have a token budget only (agent/settings.py refuses a dollar one).
Pure: reads a file when asked to, nothing else.

AGENT_PRICES is a JSON object, a model's name -> its price, the shipped table's shape:

    {"my-model": {"input": 0.5, "cached_input": 0.05, "output": 1.5, "max_output_tokens": 8192,
                  "date": "2026-12-01", "source": "https://example.com/pricing"}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

PUSD_PER_USD = 10**12  # picodollars in a dollar: a price per million tokens to 6 decimals is whole per token
DEFAULT_MAX_OUTPUT_TOKENS = 4096  # tokens: the most a call asks for when neither the table nor the file says
MAX_PRICE_PER_MILLION = 10_000.0  # US dollars: a larger price is a typo (the dearest list price is ~$150)
PRICES_VARIABLE = "AGENT_PRICES"
OPENAI_PAGE = "https://platform.openai.com/docs/pricing"
ANTHROPIC_PAGE = "https://platform.claude.com/docs/en/about-claude/pricing"
LISTED_ON = "2026-12-05"  # the day the list prices below were read off the providers' pages


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens; `max_output_tokens`: the most one reply may be asked for."""

    input: float
    cached_input: float
    output: float
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    date: str = ""
    source: str = ""

    @property
    def input_pusd(self) -> int:
        """Picodollars per input token."""
        return per_token_pusd(self.input)

    @property
    def cached_input_pusd(self) -> int:
        return per_token_pusd(self.cached_input)

    @property
    def output_pusd(self) -> int:
        return per_token_pusd(self.output)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Price:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# The list prices of the models the README names (and their neighbours), and the demo's own. Ollama's
# llama3.2 runs on your machine: it has no list price, so it takes a token budget only.
SHIPPED: dict[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.075, 0.60, 16_384, LISTED_ON, OPENAI_PAGE),
    "gpt-4o": Price(2.50, 1.25, 10.00, 16_384, LISTED_ON, OPENAI_PAGE),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60, 32_768, LISTED_ON, OPENAI_PAGE),
    "gpt-4.1": Price(2.00, 0.50, 8.00, 32_768, LISTED_ON, OPENAI_PAGE),
    # cached_input: Anthropic's "cache hits"; this client asks for no cache writes (no cache_control)
    "claude-sonnet-4-5": Price(3.00, 0.30, 15.00, 64_000, LISTED_ON, ANTHROPIC_PAGE),
    "claude-sonnet-5": Price(2.00, 0.20, 10.00, 128_000, LISTED_ON, ANTHROPIC_PAGE),
    "claude-haiku-4-5": Price(1.00, 0.10, 5.00, 64_000, LISTED_ON, ANTHROPIC_PAGE),
    "claude-opus-4-5": Price(5.00, 0.50, 25.00, 64_000, LISTED_ON, ANTHROPIC_PAGE),
    # Not a real price: the demo's, chosen so that a walkthrough's turn costs a few tenths of a cent.
    "demo": Price(2.00, 0.20, 8.00, 4096, LISTED_ON, "this project (a made-up price for the offline demo model)"),
}


class PriceFileError(ValueError):
    """AGENT_PRICES names a file that cannot be read as prices; the message says what is wrong."""


def per_token_pusd(usd_per_million: float) -> int:
    """Picodollars per token for a price in US dollars per million tokens (exact to 6 decimals, then up)."""
    exact = Decimal(str(usd_per_million)) * PUSD_PER_USD / 10**6
    return int(exact.to_integral_value(rounding="ROUND_CEILING"))


def usd_to_pusd(usd: float) -> int:
    """A budget in US dollars as whole picodollars, rounded down: a budget never grows by rounding."""
    return int((Decimal(str(usd)) * PUSD_PER_USD).to_integral_value(rounding="ROUND_FLOOR"))


def pusd_to_usd(pusd: int) -> float:
    return pusd / PUSD_PER_USD


def price_for(model: str, extra: Mapping[str, Price] | None = None) -> Price | None:
    """The price of `model` (`extra`, from AGENT_PRICES, first), or None when it has none. A model name that
    carries a date (`claude-sonnet-4-5-20250929`) or the demo's scenario (`demo:slow@1`) has its family's price."""
    tables = [extra or {}, SHIPPED]
    for table in tables:
        if model in table:
            return table[model]
    base = model.split(":", 1)[0].split("@", 1)[0].split("~", 1)[0]
    for table in tables:
        if base in table:
            return table[base]
    for table in tables:  # a dated snapshot: the longest name it starts with
        for name in sorted(table, key=len, reverse=True):
            if base.startswith(name + "-") and base[len(name) + 1:].replace("-", "").isdigit():
                return table[name]
    return None


def load_prices(path: str) -> dict[str, Price]:
    """The prices in the file AGENT_PRICES names; PriceFileError says what is wrong, in one line."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PriceFileError(f"cannot read {path!r} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise PriceFileError(f"{path!r} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PriceFileError(f"{path!r} must hold a JSON object: a model's name -> its price")
    return {str(model): _price(model, raw) for model, raw in data.items()}


def _price(model: str, raw) -> Price:
    if not isinstance(raw, dict):
        raise PriceFileError(f"the price of {model!r} must be an object with input, cached_input and output")
    values = {}
    for name in ("input", "cached_input", "output"):
        value = raw.get(name, raw.get("input") if name == "cached_input" else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_PRICE_PER_MILLION:
            raise PriceFileError(f"{model!r}: {name} must be US dollars per million tokens, from 0 to "
                                 f"{MAX_PRICE_PER_MILLION:g}, not {value!r}")
        try:
            Decimal(str(value))
        except InvalidOperation:  # pragma: no cover - a finite float always converts
            raise PriceFileError(f"{model!r}: {name} is not a number") from None
        values[name] = float(value)
    max_output = raw.get("max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS)
    if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1:
        raise PriceFileError(f"{model!r}: max_output_tokens must be a whole number of at least 1, not {max_output!r}")
    return Price(values["input"], values["cached_input"], values["output"], max_output,
                 str(raw.get("date", "")), str(raw.get("source", "")))
