"""What a sweep varies: axes (`--vary NAME=v1,v2,...`: a workload option, or any engine
setting by its config name), the runs they apply to, and the SLOs on run summaries.
Several axes make a grid: the x axis (the knee's) is the last `--vary`, every other
combination times every run is one series. With no `--vary` the runs are the x axis.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepserve.bench.results import from_fields
from stepserve.config.load import config_fields, parse_bool
from stepserve.config.settings import EngineConfig
from stepserve.metrics.run_summary import FIELD_KINDS, RunSummary
from stepserve.sim.scenarios import RunSpec
from stepserve.workload.overrides import WorkloadOverrides

WORKLOAD_AXES = {"rate": float, "seed": int, "concurrency": int}
RUN_AXIS = "run"  # the name of the x axis when the runs themselves are swept


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[Any, ...]
    target: str  # "workload" or "config"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "values": list(self.values), "target": self.target}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Axis:
        return from_fields(cls, data, values=tuple)


def parse_vary(text: str) -> Axis:
    """`max_num_seqs=16,32,64` -> Axis; values typed by the setting's kind."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not raw.strip():
        raise ValueError(f"--vary {text!r}: expected NAME=v1,v2,...")
    kinds = {f.name: f.metadata["kind"] for _s, f in config_fields()}
    if name in WORKLOAD_AXES:
        kind, target = WORKLOAD_AXES[name], "workload"
    elif name in kinds:
        kind, target = kinds[name], "config"
    else:
        known = ", ".join(sorted(WORKLOAD_AXES) + sorted(kinds))
        raise ValueError(f"--vary {name!r}: unknown; allowed: {known}")
    values = []
    for item in raw.split(","):
        item = item.strip()
        try:
            values.append(parse_bool(item) if kind is bool else kind(item))
        except (ValueError, TypeError) as e:
            raise ValueError(f"--vary {name}: value {item!r} is not a {kind.__name__}") from e
    if len(set(values)) != len(values):
        raise ValueError(f"--vary {name}: repeated values in {raw!r}")
    return Axis(name, tuple(values), target)


@dataclass(frozen=True)
class SweepPoint:
    """One simulation: a run's config with the axis values applied."""

    label: str  # e.g. "A rate=8"
    series: str  # e.g. "A" or "A max_num_seqs=64"
    run: str
    x: Any  # value on the x axis (the run name when the runs are the axis)
    values: dict[str, Any]  # every axis value at this point
    config: EngineConfig
    workload_overrides: WorkloadOverrides = WorkloadOverrides()


def format_x(value: Any) -> str:
    """A swept value as the texts and plots write it."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def build_points(runs: list[RunSpec], axes: list[Axis]) -> tuple[str, list[SweepPoint]]:
    """The grid, series by series, x ascending in the given order. Returns (x axis name,
    points)."""
    if not runs:
        raise ValueError("a sweep needs at least one config")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"config names must differ: {', '.join(names)}")
    if len({a.name for a in axes}) != len(axes):
        raise ValueError("each --vary name may appear once")
    if not axes:
        return RUN_AXIS, [SweepPoint(r.name, "configs", r.name, r.name, {RUN_AXIS: r.name},
                                     r.config) for r in runs]
    points: list[SweepPoint] = []
    x_axis, others = axes[-1], axes[:-1]
    for r in runs:
        for combo in itertools.product(*(a.values for a in others)):
            fixed = dict(zip((a.name for a in others), combo))
            series = " ".join([r.name] + [f"{k}={format_x(v)}" for k, v in fixed.items()])
            for x in x_axis.values:
                values = {**fixed, x_axis.name: x}
                config_changes = {k: v for k, v in values.items() if k not in WORKLOAD_AXES}
                load = WorkloadOverrides(**{k: v for k, v in values.items() if k in WORKLOAD_AXES})
                config = r.config.replace(**config_changes) if config_changes else r.config
                label = f"{series} {x_axis.name}={format_x(x)}"
                points.append(SweepPoint(label, series, r.name, x, values, config, load))
    return x_axis.name, points


@dataclass(frozen=True)
class SummarySLO:
    """A limit on one metric of a run's summary (`--slo`): `ttft_p99_s=2` (or `<=`): at
    most 2; `throughput_tokens_per_s>=1000`: at least. (bench's `--goodput` is another
    thing: per-request latency limits, bench/results.py.)"""

    metric: str
    limit: float
    at_least: bool = False

    def met_by(self, summary: RunSummary) -> bool:
        value = summary.metric(self.metric)
        if value is None:
            return False
        return value >= self.limit if self.at_least else value <= self.limit

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.at_least else '<='} {self.limit:g}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummarySLO:
        return from_fields(cls, data)


def parse_summary_slo(text: str) -> SummarySLO:
    """`METRIC=LIMIT` or `METRIC>=LIMIT`; METRIC names a number of a run's summary."""
    for op, at_least in ((">=", True), ("<=", False), ("=", False)):
        if op in text:
            metric, _, raw = text.partition(op)
            metric = metric.strip()
            if FIELD_KINDS.get(metric) is not float:
                raise ValueError(f"--slo {text!r}: {metric!r} is not a number of a run's "
                                 "summary (e.g. ttft_p99_s, e2e_p99_s, tpot_p99_s, "
                                 "throughput_tokens_per_s)")
            try:
                return SummarySLO(metric, float(raw), at_least)
            except ValueError:
                break
    raise ValueError(f"--slo {text!r}: expected METRIC=LIMIT (at most) or METRIC>=LIMIT, "
                     "e.g. ttft_p99_s=2")
