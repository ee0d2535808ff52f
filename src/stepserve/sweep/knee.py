"""The knee: where throughput stops rising while the tail climbs (seed, "最小上手").

Along one series (points in x order), the knee is the first point whose throughput gains
less than `min_throughput_gain` over the previous point while its P99 rises more than
`max_p99_rise`. Production should sit before it. With SLOs, `best_slo` is the highest load
(last point in x order) meeting every SLO, and `recommended` the last point before the knee
that meets them.

Without a knee, throughput may still stop rising while P99 climbs less than the rule asks
(a mild tail, or a closed loop that cannot queue). The first such "flat" step (gain below
`min_throughput_gain`, P99 not falling) is reported; the recommendation then stops before
it, since the point before already had that throughput. With neither, it is the last
point (meeting the SLOs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from stepserve.sweep.spec import Slo

MIN_THROUGHPUT_GAIN = 0.05
MAX_P99_RISE = 0.50
THROUGHPUT_METRIC = "throughput_tokens_per_s"
# Queueing shows first in TTFT: past capacity new requests wait before their first token,
# while E2E of a fixed request count is dominated by the decode lengths (the seed's
# "P99 starts to climb steeply" is a queueing signal).
P99_METRIC = "ttft_p99_s"


@dataclass(frozen=True)
class Step:
    """From point i-1 to point i: relative throughput gain and P99 rise (None if undefined)."""

    index: int
    throughput_gain: float | None
    p99_rise: float | None


@dataclass(frozen=True)
class KneeResult:
    series: str
    xs: list[Any]
    steps: list[Step]
    knee_index: int | None
    knee_x: Any
    throughput_gain: float | None  # at the knee
    p99_rise: float | None  # at the knee
    slo_met: list[bool]
    best_slo_index: int | None
    recommended_index: int | None
    reason: str  # one line: why this recommendation
    flat_index: int | None = None  # no knee: the first point whose throughput stayed flat

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return (new - old) / old


def steps_between(throughput: Sequence[float | None], p99: Sequence[float | None]) -> list[Step]:
    return [Step(i, _rel(throughput[i], throughput[i - 1]), _rel(p99[i], p99[i - 1]))
            for i in range(1, len(throughput))]


def find_knee(throughput: Sequence[float | None], p99: Sequence[float | None],
              min_throughput_gain: float = MIN_THROUGHPUT_GAIN,
              max_p99_rise: float = MAX_P99_RISE) -> Step | None:
    """The first step where throughput gains < min gain and P99 rises > max rise."""
    if len(throughput) != len(p99):
        raise ValueError("throughput and p99 must have one value per point")
    for step in steps_between(throughput, p99):
        if (step.throughput_gain is not None and step.p99_rise is not None
                and step.throughput_gain < min_throughput_gain
                and step.p99_rise > max_p99_rise):
            return step
    return None


def find_flat(steps: Sequence[Step], min_throughput_gain: float) -> Step | None:
    """The first step where throughput gains < min gain while P99 does not fall."""
    for step in steps:
        if (step.throughput_gain is not None and step.throughput_gain < min_throughput_gain
                and (step.p99_rise is None or step.p99_rise >= 0)):
            return step
    return None


def _x(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def analyze_series(series: str, xs: Sequence[Any], summaries: Sequence[dict[str, Any]],
                   slos: Sequence[Slo] = (), p99_metric: str = P99_METRIC,
                   min_throughput_gain: float = MIN_THROUGHPUT_GAIN,
                   max_p99_rise: float = MAX_P99_RISE) -> KneeResult:
    throughput = [s.get(THROUGHPUT_METRIC) for s in summaries]
    p99 = [s.get(p99_metric) for s in summaries]
    knee = find_knee(throughput, p99, min_throughput_gain, max_p99_rise)
    steps = steps_between(throughput, p99)
    flat = None if knee else find_flat(steps, min_throughput_gain)
    met = [all(slo.met_by(s) for slo in slos) for s in summaries]
    best = max((i for i, ok in enumerate(met) if ok), default=None)
    stop = knee or flat
    limit = stop.index if stop else len(summaries)
    rec = max((i for i in range(limit) if met[i]), default=None)
    slo_text = " and ".join(s.describe() for s in slos)
    meeting = f" meeting {slo_text}" if slos else ""
    if rec is None:
        where = "before the knee" if knee else "before throughput went flat" if flat else ""
        reason = (f"no point {where} meets {slo_text}".replace("  ", " ") if slos
                  else "the first point is the knee" if knee
                  else "throughput is flat from the second point")
    elif knee:
        reason = f"last point before the knee (x={_x(xs[knee.index])}){meeting}"
    elif flat:
        reason = (f"no knee, but throughput stopped rising at x={_x(xs[flat.index])} "
                  f"({flat.throughput_gain:+.1%}, P99 "
                  f"{'?' if flat.p99_rise is None else f'{flat.p99_rise:+.1%}'}): last "
                  f"point before it{meeting}; more load there buys queueing, not tokens")
    else:
        reason = f"no knee; last point{meeting}"
    return KneeResult(series, list(xs), steps,
                      knee.index if knee else None, xs[knee.index] if knee else None,
                      knee.throughput_gain if knee else None, knee.p99_rise if knee else None,
                      met, best, rec, reason, flat.index if flat else None)


def group_series(runs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Sweep runs by series, in the order they ran (x order)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        out.setdefault(run["sweep"]["series"], []).append(run)
    return out


def analyze_runs(runs: Sequence[dict[str, Any]], slos: Sequence[Slo] = (),
                 p99_metric: str = P99_METRIC,
                 min_throughput_gain: float = MIN_THROUGHPUT_GAIN,
                 max_p99_rise: float = MAX_P99_RISE) -> list[KneeResult]:
    return [analyze_series(name, [r["sweep"]["x"] for r in group],
                           [r["summary"] for r in group], slos, p99_metric,
                           min_throughput_gain, max_p99_rise)
            for name, group in group_series(runs).items()]
