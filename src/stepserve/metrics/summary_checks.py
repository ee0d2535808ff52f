"""Which values a run's summary (summary.py's keys, or a bench or live summary) and its
config can hold, so `stepserve doctor` refuses a file with impossible ones instead of
reasoning from them (a negative preemption count, a share of 1.5, a NaN latency).

Numbers are classed by their key's name: the queue's fitted slopes may be negative;
shares and ratios of held slots are in [0, 1]; every other number (counts, tokens,
seconds, throughputs, P99/P50 ratios, settings) is >= 0. Every number must be finite.
Strings, booleans and nulls are not checked: the rules ignore what is not a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# fitted slopes of the waiting queue: a queue that drains has a negative one
SIGNED_KEYS = frozenset({"waiting_growth", "waiting_trend_rise"})
# far beyond any count, token total or duration a run can have; keeps the rules' float
# arithmetic from overflowing on a 400-digit integer
MAGNITUDE_MAX = 1e18


def _is_share(key: str) -> bool:
    return key.endswith("_share") or key == "slot_utilization" \
        or key.startswith(("active_ratio_", "kv_usage_"))


def allowed(key: str) -> tuple[float, float, str]:
    """(lo, hi, how to say it) for the number under `key`."""
    if key in SIGNED_KEYS:
        return -MAGNITUDE_MAX, MAGNITUDE_MAX, "a finite number"
    if _is_share(key):
        return 0.0, 1.0, "a share in [0, 1]"
    return 0.0, MAGNITUDE_MAX, f"a finite number >= 0 (at most {MAGNITUDE_MAX:g})"


def _bad(value: float, lo: float, hi: float) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return not lo <= value <= hi  # an int compares exactly, however large


def impossible_values(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`key = value: must be ...` for each impossible number, nested mappings (config
    sections, error counts) included, their keys prefixed `section.`."""
    problems: list[str] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            problems += impossible_values(value, f"{prefix}{key}.")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        lo, hi, text = allowed(str(key))
        if _bad(value, lo, hi):
            problems.append(f"{prefix}{key} = {value!r}: must be {text}")
    return problems
