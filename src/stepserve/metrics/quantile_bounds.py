"""Quantiles that a server's histogram buckets pin down only to a wide bucket.

A live window's quantiles are interpolated inside the bucket holding their rank, as
Prometheus' histogram_quantile does; all the buckets say is that the true value lies in
that bucket. Where the bucket is wide (its upper bound over WIDE_BUCKET_RATIO times its
lower; the first bucket, from 0, and the +Inf bucket always are), the summary keeps the
bounds (RunSummary.quantile_bounds), the report prints them beside the interpolated value,
and a rule compares (the quantiles it needs, and a needed ratio's parts) at the bound
least in favour of an alert: a tail (P95, P99) at its lower bound, a median (P50) at its
upper; what it only quotes stays as interpolated. Every latency rule alerts on a tail that
is large against a line, a median or a step, or stays silent on a median that is large,
so read that way no alert rests on where interpolation put a value inside a bucket; the
price is an alert that narrower buckets would have shown, which the printed bounds let a
reader weigh.

Why 1.5: in a bucket up to 1.5x wide the interpolated value is at most a third above
or below the true one (relative to itself); vLLM's and our latency buckets step by
1.25-1.5x where they are fine (0.5, 0.75, 1; 5, 7.5, 10 s) and by 2-4x where they are
coarse (10, 20, 40, 80, 160, 640 s), where a P99 interpolated to 78 s inside 40-80 s was
a client's 51 s.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from stepserve.metrics.prometheus import BucketQuantile
from stepserve.metrics.run_summary import FIELD_KINDS, RunSummary

WIDE_BUCKET_RATIO = 1.5
_TAILS = ("p95", "p99")
_MEDIAN = "p50"
_NAMES = {"ttft": "TTFT", "e2e": "E2E", "tpot": "TPOT", "itl": "ITL", "step": "step time",
          "queue_time": "queue time"}


def is_wide(q: BucketQuantile) -> bool:
    return q.upper > WIDE_BUCKET_RATIO * q.lower


def bounds_entry(q: BucketQuantile) -> dict[str, float | None]:
    """A wide quantile's bounds as the summary keeps them (upper None: the +Inf bucket,
    which JSON cannot write)."""
    return {"lower": q.lower, "upper": None if math.isinf(q.upper) else q.upper}


def _split(name: str) -> tuple[str, str] | None:
    """("ttft", "p99") for ttft_p99_s; None for a name that is no quantile field."""
    stem, _, tail = name.removesuffix("_s").rpartition("_")
    if not name.endswith("_s") or FIELD_KINDS.get(name) is not float \
            or tail not in (*_TAILS, _MEDIAN):
        return None
    return stem, tail


@dataclass(frozen=True)
class Bounds:
    """One quantile field's bucket, as a summary holds it: (lower, upper], upper None for
    the +Inf bucket."""

    name: str
    lower: float
    upper: float | None

    @property
    def rules_read(self) -> float | None:
        """The value the rules take: a tail's lower bound, a median's upper (None past
        the top bucket: unknown)."""
        _stem, which = _split(self.name) or ("", "")
        return self.lower if which in _TAILS else self.upper

    def describe(self, interpolated: float | None) -> str:
        """e.g. "TTFT P99 in 20-40 s (interpolated 39.6 s)"."""
        stem, which = _split(self.name) or (self.name, "")
        label = f"{_NAMES.get(stem, stem)} {which.upper()}"
        shown = f" (interpolated {interpolated:.3g} s)" if interpolated is not None else ""
        if self.upper is None:
            return f"{label} above {self.lower:.3g} s, past the top bucket{shown}"
        return f"{label} in {self.lower:.3g}-{self.upper:.3g} s{shown}"

    def to_json(self, interpolated: float | None) -> dict[str, float | None]:
        return {"lower": self.lower, "upper": self.upper, "interpolated": interpolated,
                "rules_read": self.rules_read}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_bounds(summary: RunSummary) -> list[Bounds]:
    """The summary's wide quantiles, in its order; an entry that is no quantile field's,
    or whose bounds are not numbers with lower <= upper, is left out (a file may hold
    anything)."""
    held = summary.quantile_bounds
    if not isinstance(held, Mapping):
        return []
    out = []
    for name, entry in held.items():
        if _split(str(name)) is None or not isinstance(entry, Mapping):
            continue
        lower, upper = entry.get("lower"), entry.get("upper")
        if not _number(lower) or lower < 0 or not (upper is None or _number(upper)):
            continue
        if upper is not None and upper < lower:
            continue
        out.append(Bounds(str(name), float(lower), None if upper is None else float(upper)))
    return out


def _ratio_parts(name: str) -> tuple[str, str] | None:
    """(ttft_p99_s, ttft_p50_s) for p99_p50_ttft_ratio; None for any other name."""
    if not (name.startswith("p99_p50_") and name.endswith("_ratio")):
        return None
    stem = name.removeprefix("p99_p50_").removesuffix("_ratio")
    return f"{stem}_p99_s", f"{stem}_p50_s"


def verdict_summary(summary: RunSummary, compared: Collection[str] | None = None
                    ) -> RunSummary:
    """The summary as a rule reads it: each wide quantile it compares at the bound of
    Bounds.rules_read, and each P99/P50 ratio it compares worked out again from those
    where a part is wide (at least 1: a distribution's P99 is never under its P50).
    `compared`: the fields the rule compares (a ratio's parts with it); None: all. What
    it only quotes stays as interpolated. The summary itself without wide quantiles."""
    bounds = read_bounds(summary)
    if not bounds:
        return summary
    names = set(FIELD_KINDS) if compared is None else set(compared)
    ratios = [(name, parts) for name in sorted(names)
              if (parts := _ratio_parts(name)) is not None and name in FIELD_KINDS
              and all(p in FIELD_KINDS for p in parts)]
    names.update(p for _name, parts in ratios for p in parts)
    values: dict[str, float | None] = {b.name: b.rules_read for b in bounds if b.name in names}
    for name, (p99_name, p50_name) in ratios:
        if p99_name in values or p50_name in values:
            p99 = values.get(p99_name, getattr(summary, p99_name))
            p50 = values.get(p50_name, getattr(summary, p50_name))
            values[name] = max(1.0, p99 / p50) if p99 is not None and p50 else None
    return replace(summary, **values)


def bounds_notes(summary: RunSummary) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The report's line on the wide quantiles (none without them) and their `bounds`
    for --json: {field: {lower, upper, interpolated, rules_read}}."""
    bounds = read_bounds(summary)
    if not bounds:
        return [], {}
    shown = "; ".join(b.describe(getattr(summary, b.name)) for b in bounds)
    line = (f"  wide buckets: {shown}; a rule compares a tail (P99) at its bucket's lower "
            "bound and a median (P50) at its upper, so no alert rests on the interpolation")
    return [line], {b.name: b.to_json(getattr(summary, b.name)) for b in bounds}
