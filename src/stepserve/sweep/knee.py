"""The knee: the last point before the tail jumps, where throughput stops rising
(production should sit before it); docs/guide.md tells the rule in full.

Along one series, throughput *saturates* at the first point gaining under
`min_throughput_gain` while its P99 rises over `max_p99_rise`; the steps into it whose
P99 rose over `max_p99_rise` are the climb, its steepest step the *cliff*, and the knee
the point just before the cliff (TTFT P99 can jump from 0.2 s to minutes while
throughput still gains, so the saturated point would be past the cliff). Without a knee,
an ordered axis stops where throughput went flat (no later point beats it by more than
`noise_margin`, in throughput or a lower tail); a named axis takes the lowest tail among
the points near the most throughput. `recommended` meets every SLO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from stepserve.bench.results import from_fields
from stepserve.metrics.run_summary import RunSummary
from stepserve.sweep.spec import SummarySLO, format_x

if TYPE_CHECKING:
    from stepserve.sweep.result import SweepPointResult

MIN_THROUGHPUT_GAIN = 0.05
MAX_P99_RISE = 0.50
NOISE_MARGIN = 0.05
LOAD_AXES = ("rate", "concurrency")
UNORDERED_AXES = ("seed", "run")  # numbers or names whose order means nothing
# Queueing shows first in TTFT: past capacity new requests wait before their first token,
# while E2E of a fixed request count is dominated by the decode lengths (the quick start's
# "P99 starts to climb steeply" is a queueing signal).
P99_METRIC = "ttft_p99_s"


@dataclass(frozen=True)
class KneeRule:
    """When a series has a knee (the module doc) and which points meet the SLOs."""

    min_throughput_gain: float
    max_p99_rise: float
    p99_metric: str
    slos: list[SummarySLO] = field(default_factory=list)
    noise_margin: float = NOISE_MARGIN

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # the SLOs as SummarySLO.to_json writes them

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KneeRule:
        return from_fields(cls, data, slos=lambda slos: [SummarySLO.from_json(s) for s in slos])


@dataclass(frozen=True)
class Step:
    """From point i-1 to point i: relative throughput gain and P99 rise (None if undefined)."""

    index: int
    throughput_gain: float | None
    p99_rise: float | None


@dataclass(frozen=True)
class KneeResult:
    """One series' knee and recommendation. `knee_index` is the last point before the
    cliff (`cliff_index`, the steepest P99 step into saturation), `saturated_index` where
    throughput stopped rising while P99 climbed (the rule's step: `throughput_gain` and
    `p99_rise` are its values). `cliff_p99_rise`: the P99 rise at the cliff."""

    series: str
    xs: list[Any]
    steps: list[Step]
    knee_index: int | None
    knee_x: Any
    throughput_gain: float | None  # at saturation
    p99_rise: float | None  # at saturation
    slo_met: list[bool]
    best_slo_index: int | None
    recommended_index: int | None
    reason: str  # one line: why this recommendation
    flat_index: int | None = None  # no knee: the first point whose throughput stayed flat
    cliff_index: int | None = None
    cliff_p99_rise: float | None = None
    saturated_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KneeResult:
        values = {f.name: data.get(f.name) for f in fields(cls)}
        values["steps"] = [from_fields(Step, s) for s in data.get("steps") or []]
        return cls(**values)


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
    """Saturation: the first step where throughput gains < min gain and P99 rises > max
    rise. The knee is before it (`find_cliff`)."""
    if len(throughput) != len(p99):
        raise ValueError("throughput and p99 must have one value per point")
    for step in steps_between(throughput, p99):
        if (step.throughput_gain is not None and step.p99_rise is not None
                and step.throughput_gain < min_throughput_gain
                and step.p99_rise > max_p99_rise):
            return step
    return None


def find_cliff(steps: Sequence[Step], saturation: Step, max_p99_rise: float) -> Step:
    """The steepest P99 step of the climb into `saturation`: the run of consecutive steps
    up to it whose P99 rose more than `max_p99_rise` (the first of equals)."""
    climb = [saturation]
    for step in reversed(steps[:saturation.index - 1]):
        if step.p99_rise is None or step.p99_rise <= max_p99_rise:
            break
        climb.append(step)
    return max(reversed(climb), key=lambda s: s.p99_rise or 0.0)


def find_flat(throughput: Sequence[float | None], p99: Sequence[float | None],
              noise_margin: float = NOISE_MARGIN) -> int | None:
    """The point after the first one that no later point beats by more than
    `noise_margin`, in throughput or in a lower P99; None when the last point is the
    first such (throughput rose to the end)."""
    n = len(throughput)
    for i in range(n - 1):
        t, p = throughput[i], p99[i]
        if t is None:
            continue
        better = any((throughput[j] is not None
                      and throughput[j] > t * (1 + noise_margin))  # type: ignore[operator]
                     or (p is not None and p99[j] is not None
                         and p99[j] < p * (1 - noise_margin))  # type: ignore[operator]
                     for j in range(i + 1, n))
        if not better:
            return i + 1
    return None


def is_ordered(xs: Sequence[Any], x_axis: str | None = None) -> bool:
    """Whether the x values are an ordered quantity (a load or a numeric setting), so that
    "the point before" means less of it. Names (runs, policies), booleans and seeds are not."""
    # a bool is a name here, not a number
    return x_axis not in UNORDERED_AXES and \
        all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)


def _best_named(throughput: Sequence[float | None], p99: Sequence[float | None],
                met: Sequence[bool], min_throughput_gain: float) -> int | None:
    """Among the points meeting the SLOs, those within `min_throughput_gain` of the most
    throughput count as equal (the same threshold that calls a gain real); of them, the
    one with the lowest tail."""
    ok = [i for i in range(len(met)) if met[i] and throughput[i] is not None]
    if not ok:
        return None
    top = max(throughput[i] for i in ok)  # type: ignore[type-var]
    near = [i for i in ok if throughput[i] >= (1 - min_throughput_gain) * top]  # type: ignore[operator]
    return min(near, key=lambda i: p99[i] if p99[i] is not None else math.inf)


def analyze_series(series: str, xs: Sequence[Any], summaries: Sequence[RunSummary],
                   slos: Sequence[SummarySLO] = (), p99_metric: str = P99_METRIC,
                   min_throughput_gain: float = MIN_THROUGHPUT_GAIN,
                   max_p99_rise: float = MAX_P99_RISE,
                   x_axis: str | None = None,
                   noise_margin: float = NOISE_MARGIN) -> KneeResult:
    """The knee along `xs` (in the given order). Without one, an ordered axis stops the
    recommendation before throughput went flat; a named one (configs, policies) gets the
    lowest tail among the points with about the most throughput (see the module doc)."""
    throughput = [s.throughput_tokens_per_s for s in summaries]
    p99 = [s.metric(p99_metric) for s in summaries]
    saturated = find_knee(throughput, p99, min_throughput_gain, max_p99_rise)
    steps = steps_between(throughput, p99)
    cliff = find_cliff(steps, saturated, max_p99_rise) if saturated else None
    knee = cliff.index - 1 if cliff else None
    ordered = is_ordered(xs, x_axis)
    flat = None if cliff or not ordered else find_flat(throughput, p99, noise_margin)
    met = [all(slo.met_by(s) for slo in slos) for s in summaries]
    best = max((i for i, ok in enumerate(met) if ok), default=None)
    limit = knee + 1 if knee is not None else flat if flat is not None else len(summaries)
    rec = max((i for i in range(limit) if met[i]), default=None)
    slo_text = " and ".join(slo.describe() for slo in slos)
    meeting = f" meeting {slo_text}" if slos else ""
    if knee is None and not ordered:
        rec = _best_named(throughput, p99, met, min_throughput_gain)
        reason = (f"no knee; the lowest {p99_metric} among the points within "
                  f"{min_throughput_gain:.0%} of the most throughput{meeting}"
                  if rec is not None
                  else f"no point meets {slo_text}" if slos else "no throughput measured")
    elif rec is None:
        where = "at or before the knee" if cliff else \
            "before throughput went flat" if flat is not None else ""
        reason = f"no point {where} meets {slo_text}".replace("  ", " ")
    elif cliff is not None:
        assert knee is not None and saturated is not None
        # the cliff is a step of the climb: its P99 rise is known
        jump = (f"{p99_metric} jumps {cliff.p99_rise:+.0%} at x={format_x(xs[cliff.index])}, "
                f"throughput flat from x={format_x(xs[saturated.index])}")
        reason = (f"the knee{meeting}: the last point before {jump}" if rec == knee else
                  f"last point{meeting} before the knee (x={format_x(xs[knee])}; {jump})")
    elif flat is not None:
        more = ("more load there buys queueing, not tokens" if x_axis in LOAD_AXES
                else "a larger value there bought no throughput")
        reason = (f"no knee, but throughput stopped rising at x={format_x(xs[flat])}: no point "
                  f"from there on beats x={format_x(xs[flat - 1])} by more than the "
                  f"{noise_margin:.0%} noise margin, in throughput or a lower "
                  f"{p99_metric}; last point before it{meeting}; {more}")
    else:
        reason = f"no knee; last point{meeting}"
    return KneeResult(series, list(xs), steps, knee, xs[knee] if knee is not None else None,
                      saturated.throughput_gain if saturated else None,
                      saturated.p99_rise if saturated else None,
                      met, best, rec, reason, flat,
                      cliff.index if cliff else None, cliff.p99_rise if cliff else None,
                      saturated.index if saturated else None)


def group_series(runs: Sequence[SweepPointResult]) -> dict[str, list[SweepPointResult]]:
    """Sweep runs by series, in the order they ran (x order)."""
    out: dict[str, list[SweepPointResult]] = {}
    for run in runs:
        out.setdefault(run.sweep.series, []).append(run)
    return out


def analyze_runs(runs: Sequence[SweepPointResult], rule: KneeRule, x_axis: str | None = None
                 ) -> list[KneeResult]:
    return [analyze_series(name, [r.sweep.x for r in group], [r.summary for r in group],
                           rule.slos, rule.p99_metric, rule.min_throughput_gain,
                           rule.max_p99_rise, x_axis, rule.noise_margin)
            for name, group in group_series(runs).items()]
