"""Percentiles and the summary every report prints, from the standard library's `statistics`."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: int) -> float | None:
    """The q-th percentile (1..99), interpolated between the nearest values; None for no values."""
    if not 1 <= q <= 99:
        raise ValueError(f"a percentile is between 1 and 99, not {q}")
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary(values: list[float], scale: float = 1.0, digits: int = 1) -> dict:
    """n, p50, p95, min, max of values times `scale`, rounded."""
    scaled = [v * scale for v in values]

    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(scaled),
        "p50": rounded(percentile(scaled, 50)),
        "p95": rounded(percentile(scaled, 95)),
        "min": rounded(min(scaled)) if scaled else None,
        "max": rounded(max(scaled)) if scaled else None,
    }
