"""Step-level metrics from the StepRecords, one per executed step. Steps come as one list
or one per replica; queue levels are cluster-wide (after each step of any replica, the
sum of each replica's latest value), every other metric pools all replicas' records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from stepserve.core.output import StepRecord
from stepserve.metrics.percentiles import least_squares_slope, mean, percentile, ratio
from stepserve.metrics.run_summary import RunSummary

Steps = Sequence[StepRecord] | Sequence[Sequence[StepRecord]]


def per_replica(steps: Steps) -> list[list[StepRecord]]:
    """One list of records per replica; a flat list is one replica."""
    if not steps:
        return []
    if isinstance(steps[0], StepRecord):
        return [list(steps)]  # type: ignore[arg-type]
    return [list(s) for s in steps]  # type: ignore[arg-type]


def step_end(s: StepRecord) -> float:
    return s.start_s + s.duration_s


def merged_level(replicas: list[list[StepRecord]],
                 level: Callable[[StepRecord], float]) -> tuple[list[float], list[float]]:
    """(times, totals): after each step of any replica, the sum over replicas of each
    one's latest `level`. One replica: simply the level after each of its steps."""
    events = sorted((step_end(s), r, level(s)) for r, recs in enumerate(replicas) for s in recs)
    latest: list[float] = [0] * len(replicas)  # ints stay ints in the JSON
    total: float = 0
    ts: list[float] = []
    vs: list[float] = []
    for t, r, v in events:
        total += v - latest[r]
        latest[r] = v
        ts.append(t)
        vs.append(total)
    return ts, vs


def longest_monotonic_rise(ts: Sequence[float], vs: Sequence[float]) -> tuple[float, float]:
    """(seconds, rise) of the longest stretch in which the level never dropped and rose:
    from the last sample before its first rise to its last rise (flat ends trimmed)."""
    best_s, best_rise = 0.0, 0  # rise keeps the level's type (ints stay ints)
    base = 0  # the last sample before the current run's first rise
    for j in range(1, len(vs)):
        if vs[j] < vs[j - 1]:
            base = j
        elif vs[j] == vs[j - 1]:
            if vs[j] == vs[base]:
                base = j  # still on the run's flat start
        else:
            span, rise = ts[j] - ts[base], vs[j] - vs[base]
            if span > best_s or (span == best_s and rise > best_rise):
                best_s, best_rise = span, rise
    return best_s, best_rise


def queue_fields(ts: Sequence[float], vs: Sequence[float],
                 fit: tuple[float, float] | None) -> dict[str, float | None]:
    """The waiting_* fields of the queue's levels `vs` at times `ts`, its growth the
    least-squares slope of the levels inside `fit` (first, last time); none without it."""
    inside = [(t, v) for t, v in zip(ts, vs, strict=True) if fit and fit[0] <= t <= fit[1]]
    growth = least_squares_slope([t for t, _ in inside], [v for _, v in inside])
    rise_s, rise = longest_monotonic_rise(ts, vs) if vs else (None, None)
    return {"waiting_max": max(vs) if vs else None, "waiting_p50": percentile(vs, 50),
            "waiting_mean": mean(vs),
            "waiting_nonzero_share": ratio(sum(1 for v in vs if v > 0), len(vs)),
            "waiting_growth": growth,
            "waiting_trend_rise": None if growth is None
            else growth * (inside[-1][0] - inside[0][0]),
            "waiting_monotonic_rise_s": rise_s, "waiting_monotonic_rise": rise}


def step_summary(steps: Steps, offered_window: tuple[float, float] | None = None
                 ) -> RunSummary:
    """The step fields of a summary (see run_summary.py). `offered_window` is
    (first arrival, last arrival): the queue's growth is fitted inside it only, since
    after the last arrival a queue can only drain."""
    replicas = per_replica(steps)
    recs = [s for r in replicas for s in r]
    n = len(recs)
    held = [s for s in recs if s.slots_held > 0]
    active_ratios = [s.num_active / s.slots_held for s in held]
    prefill_tok = sum(s.num_prefill_tokens for s in recs)
    decode_tok = sum(s.num_decode_tokens for s in recs)
    decode_steps = [s.duration_s for s in recs if s.num_decode_tokens > 0]
    durations = [s.duration_s for s in recs]

    wt, wv = merged_level(replicas, lambda s: s.num_waiting)
    _, rv = merged_level(replicas, lambda s: s.num_running)
    _, ev = merged_level(replicas, lambda s: s.num_running + s.num_waiting + s.num_swapped)

    return RunSummary.of(
        replicas=len(replicas),
        steps=n,
        mean_step_s=mean([s.duration_s for s in recs]),
        decode_step_p50_s=percentile(decode_steps, 50),
        step_p50_s=percentile(durations, 50),
        step_p99_s=percentile(durations, 99),
        step_max_s=max(durations) if durations else None,
        slot_utilization=ratio(sum(s.num_active for s in held),
                               sum(s.slots_held for s in held)),
        active_ratio_p50=percentile(active_ratios, 50),
        active_ratio_mean=mean(active_ratios),
        prefill_step_share=ratio(sum(1 for s in recs if s.is_prefill_only), n),
        zero_decode_step_share=ratio(sum(1 for s in recs if s.is_zero_decode), n),
        prefill_token_share=ratio(prefill_tok, prefill_tok + decode_tok),
        prefill_tokens_computed=prefill_tok,
        decode_tokens_computed=decode_tok,
        **queue_fields(wt, wv, offered_window),
        running_max=max(rv) if rv else None,
        running_mean=mean(rv),
        in_engine_max=max(ev) if ev else None,
        kv_usage_max=max((s.kv_usage for s in recs), default=None),
        kv_usage_mean=mean([s.kv_usage for s in recs]),
    )


@dataclass(frozen=True)
class TimeSeries:
    """A run over time, in bins, for plots: t the bin centres (s); waiting, running the
    cluster-wide mean level (carried through empty bins); kv_usage the mean over
    replicas; the rest totals per bin. From a bench's /metrics samples a row is a sample
    (no kv_usage; steps only where counted). A None series is absent from the JSON."""

    t: list[float]
    waiting: list[float]
    running: list[float]
    kv_usage: list[float] | None
    prefill_tokens: list[float]
    decode_tokens: list[float]
    preemptions: list[float]
    steps: list[float] | None = None

    def to_json(self) -> dict[str, list]:
        return {f.name: list(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimeSeries:
        """From a result file: `t` is required, a missing series reads as empty (kv_usage
        and steps as absent)."""
        values = {f.name: data.get(f.name) for f in fields(cls)}
        for name, value in values.items():
            if value is not None and not isinstance(value, list):
                raise ValueError(f"timeseries.{name} must be a list, got "
                                 f"{type(value).__name__}")
        if values["t"] is None:
            raise ValueError("a timeseries without t")
        return cls(**{name: [] if v is None and name not in ("kv_usage", "steps") else v
                      for name, v in values.items()})


def timeseries(steps: Steps, bins: int = 100, count_steps: bool = False) -> TimeSeries:
    """Downsample the step records to `bins` equal time bins (by each step's end), with
    the step records per bin where `count_steps`."""
    if bins < 1:
        raise ValueError(f"timeseries bins = {bins!r}: must be >= 1")
    replicas = [r for r in per_replica(steps) if r]
    if not replicas:
        return TimeSeries([], [], [], [], [], [], [], [] if count_steps else None)
    t0 = min(s.start_s for r in replicas for s in r)
    t1 = max(step_end(s) for r in replicas for s in r)
    width = (t1 - t0) / bins or 1.0

    def slot(s: StepRecord) -> int:
        return min(int((step_end(s) - t0) / width), bins - 1)

    waiting, running, kv = ([0.0] * bins for _ in range(3))
    prefill, decode, preempt, counts = ([0] * bins for _ in range(4))
    for recs in replicas:
        levels: list[list[tuple[float, float, float]]] = [[] for _ in range(bins)]
        for s in recs:
            b = slot(s)
            levels[b].append((s.num_waiting, s.num_running, s.kv_usage))
            prefill[b] += s.num_prefill_tokens
            decode[b] += s.num_decode_tokens
            preempt[b] += s.num_preempted
            counts[b] += 1
        last = (0.0, 0.0, 0.0)
        for b, samples in enumerate(levels):
            if samples:  # the mean of each level over the bin's steps
                last = tuple(sum(level) / len(samples) for level in zip(*samples))
            waiting[b] += last[0]
            running[b] += last[1]
            kv[b] += last[2] / len(replicas)
    t = [t0 + (b + 0.5) * width for b in range(bins)]
    return TimeSeries(t, waiting, running, kv, prefill, decode, preempt,
                      counts if count_steps else None)
