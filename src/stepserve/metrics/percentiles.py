"""The few statistics the metrics need, in the standard library only.

`percentile` matches numpy's default ("linear") method, so numbers agree with
`vllm bench serve` and with anyone who checks them in a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0 <= p <= 100) with linear interpolation between the two
    nearest ranks, as numpy.percentile's default; None for no values."""
    if not 0.0 <= p <= 100.0 or math.isnan(p):
        raise ValueError(f"percentile p = {p!r}: must be in [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    frac = rank - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is zero."""
    if num is None or den is None or den == 0:
        return None
    return num / den


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Slope of the least-squares line through (xs, ys); None with fewer than two
    distinct x values."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"least_squares_slope: {n} x values but {len(ys)} y values")
    if n < 2:
        return None
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx
