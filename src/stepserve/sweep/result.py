"""A sweep's result as typed values: each point's run (simulated, or benched against a
live server) with where it sits in the grid and the window it was measured over, the
knees, the findings. JSON only at the edge (`to_json`, `from_json`); a result written
before steady windows has no "window" and its points measured whole runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from stepserve.bench.results import BenchRun, from_fields
from stepserve.metrics.rules import Finding, RuleSettings
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.schema import SCHEMA_KEY, SCHEMA_VERSION, check_schema
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples
from stepserve.sim.run import RunResult
from stepserve.sweep.knee import KneeResult, KneeRule
from stepserve.sweep.spec import Axis
from stepserve.sweep.window import Window, WindowRule

KIND = "sweep"


@dataclass(frozen=True)
class SweepCoords:
    """Where a point sits: its series, the run (config) it came from, its x value and
    every axis value."""

    series: str
    run: str
    x: Any
    values: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepCoords:
        return from_fields(cls, {"run": data["series"], "values": {}, **data})


@dataclass(frozen=True)
class SweepPointResult:
    """One point: a simulated run, or a bench run against a live server, and the window
    its summary was measured over (None: its whole run, as older results)."""

    result: RunResult | BenchRun
    sweep: SweepCoords
    window: Window | None = None

    @property
    def name(self) -> str:
        return self.result.name

    @property
    def summary(self) -> RunSummary:
        return self.result.summary

    @property
    def timeseries(self) -> TimeSeries | None:
        return self.result.timeseries

    @property
    def latency_samples(self) -> LatencySamples | None:
        return self.result.latency_samples

    def rule_settings(self) -> RuleSettings:
        return self.result.rule_settings()

    def to_json(self) -> dict[str, Any]:
        # a point always names its batching, null against a live server (its own)
        out = {"name": self.name, "batching": self.result.batching,
               **self.result.to_json(), "sweep": self.sweep.to_json()}
        if self.window is not None:
            out["window"] = self.window.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "run") -> SweepPointResult:
        result = BenchRun.from_json(data, name) if "target" in data \
            else RunResult.from_json(data, name)
        return cls(result, SweepCoords.from_json(data["sweep"]),
                   Window.from_json(data.get("window")))


@dataclass(frozen=True)
class SweepResult:
    """`stepserve sweep`'s result. `stopped` says why it ended early ("interrupted", or
    the error that stopped a live sweep); None when every point ran."""

    scenario: str
    description: str
    cost_model: str | None  # None against a live server
    target: str  # "sim" or the server's URL
    requests_per_point: int
    duration_s_per_point: float | None
    stopped: str | None
    x_axis: str
    axes: list[Axis]
    knee_rule: KneeRule
    runs: list[SweepPointResult]
    knees: list[KneeResult]
    findings: list[Finding]
    window: WindowRule | None = None  # how points were measured; None: whole runs (older)

    @property
    def interrupted(self) -> bool:
        return self.stopped is not None

    def to_json(self) -> dict[str, Any]:
        return {
            SCHEMA_KEY: SCHEMA_VERSION, "kind": KIND, "scenario": self.scenario,
            "description": self.description, "cost_model": self.cost_model,
            "target": self.target, "requests_per_point": self.requests_per_point,
            "duration_s_per_point": self.duration_s_per_point,
            "interrupted": self.interrupted, "stopped": self.stopped, "x_axis": self.x_axis,
            "axes": [a.to_json() for a in self.axes], "knee_rule": self.knee_rule.to_json(),
            "window": self.window.to_json() if self.window else None,
            "runs": [r.to_json() for r in self.runs],
            "knees": [k.to_json() for k in self.knees],
            "findings": [f.to_json() for f in self.findings],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "result") -> SweepResult:
        check_schema(data, where)
        stopped = data.get("stopped")
        if stopped is None and data.get("interrupted"):
            stopped = "interrupted"
        return cls(
            scenario=str(data.get("scenario") or ""),
            description=str(data.get("description") or ""),
            cost_model=data.get("cost_model"), target=str(data.get("target", "sim")),
            requests_per_point=data.get("requests_per_point", 0),
            duration_s_per_point=data.get("duration_s_per_point"), stopped=stopped,
            x_axis=str(data["x_axis"]), axes=[Axis.from_json(a) for a in data.get("axes", [])],
            knee_rule=KneeRule.from_json(data["knee_rule"]),
            runs=[SweepPointResult.from_json(r, f"run {i}")
                  for i, r in enumerate(data["runs"])],
            knees=[KneeResult.from_json(k) for k in data.get("knees") or []],
            findings=[Finding.from_json(f) for f in data.get("findings") or []],
            window=WindowRule.from_json(data.get("window")))
