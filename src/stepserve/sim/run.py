"""Running simulations, and their results as typed values: a RunResult per config run
and a SimulateResult per scenario or workload file; JSON only at the edge (the shape
other tools read: schema_version, scenario, description, cost_model, workload, runs,
findings, and comparison for batching comparisons).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.load import apply_nested, to_dict
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.base import check_holds_one_sequence
from stepserve.metrics.rules import Finding, RuleSettings, findings_for
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.schema import SCHEMA_KEY, SCHEMA_VERSION, check_schema
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples, measure_run
from stepserve.plan.speedup import speedup_for_lengths
from stepserve.routing.pools import Deployment, deployment_from
from stepserve.sim.cost import CostModel
from stepserve.sim.loop import SimResult, simulate
from stepserve.sim.scenarios import RunSpec, Scenario
from stepserve.workload.overrides import WorkloadOverrides
from stepserve.workload.spec import RequestSpec, Workload


def config_facts(config: EngineConfig) -> dict[str, Any]:
    """The settings the doctor's rules compare against, copied into each summary."""
    sc = config.scheduler
    return {"batching": sc.batching, "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "long_prefill_token_threshold": sc.long_prefill_token_threshold,
            "enable_chunked_prefill": sc.enable_chunked_prefill,
            "budget_order": sc.budget_order, "max_waiting": config.queue.max_waiting,
            "replicas": config.replicas}


@dataclass(frozen=True)
class RunResult:
    """One config run on the simulator. `config` None: a file's config this version
    cannot read; `by_class` only for several request classes."""

    name: str
    batching: str | None
    config: EngineConfig | None
    num_gpu_blocks: int | None
    summary: RunSummary
    note: str = ""
    by_class: dict[str, RunSummary] | None = None
    deployment: dict[str, Any] | None = None  # pools and rules (--pools), else None
    timeseries: TimeSeries | None = None
    latency_samples: LatencySamples | None = None

    def rule_settings(self) -> RuleSettings:
        config = to_dict(self.config) if self.config is not None else None
        return RuleSettings.of(self.summary, config, self.batching)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "batching": self.batching, "note": self.note,
            "config": to_dict(self.config) if self.config is not None else None,
            "num_gpu_blocks": self.num_gpu_blocks, "summary": self.summary.to_json()}
        if self.by_class is not None:
            out["by_class"] = {k: s.to_json() for k, s in self.by_class.items()}
        if self.deployment is not None:
            out["deployment"] = self.deployment
        for key in ("timeseries", "latency_samples"):
            if (value := getattr(self, key)) is not None:
                out[key] = value.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "run") -> RunResult:
        """A run of a result file of any version; `name` when it has none."""
        by_class, ts, samples = (data.get(k) for k in ("by_class", "timeseries",
                                                       "latency_samples"))
        return cls(
            name=str(data.get("name", name)), batching=data.get("batching"),
            config=_config(data.get("config")), num_gpu_blocks=data.get("num_gpu_blocks"),
            summary=RunSummary.from_json(data["summary"]), note=str(data.get("note", "")),
            by_class=None if by_class is None else
            {str(k): RunSummary.from_json(s) for k, s in by_class.items()},
            deployment=data.get("deployment") if isinstance(data.get("deployment"), dict)
            else None,
            timeseries=None if ts is None else TimeSeries.from_json(ts),
            latency_samples=None if samples is None else LatencySamples.from_json(samples))


def _config(data: Any) -> EngineConfig | None:
    if not isinstance(data, dict):
        return None
    try:
        return apply_nested(EngineConfig(), data)
    except (TypeError, ValueError):  # another version's settings: the numbers still read
        return None


def run_result(name: str, config: EngineConfig, sim: SimResult, note: str = "",
               deployment: Deployment | None = None) -> RunResult:
    """A simulation measured: every request once, for the summary, classes and samples."""
    measured = measure_run(sim.requests, sim.steps, sim.duration_s)
    return RunResult(name=name, batching=config.scheduler.batching, config=config,
                     num_gpu_blocks=sim.num_gpu_blocks,
                     summary=measured.summary.with_values(**config_facts(config)),
                     note=note, by_class=measured.by_class,
                     deployment=deployment.describe() if deployment else None,
                     timeseries=measured.timeseries,
                     latency_samples=measured.latency_samples)


def check_simulated_cache(config: EngineConfig, num_gpu_blocks: int,
                          source: str = "num_gpu_blocks") -> None:
    """A replica of `config` with `num_gpu_blocks` (from `num_gpu_blocks_for`, which
    bounds it) can run: it holds one sequence of max_model_len; swap_space and
    gpu_memory_utilization size a real machine's memory, which the simulator has not, so
    it refuses them rather than ignore them."""
    cache = config.cache
    for name, value in (("swap_space", cache.swap_space),
                        ("gpu_memory_utilization", cache.gpu_memory_utilization)):
        if value:
            raise ConfigError(f"{name} = {value:g}: sizes a real engine's memory; the "
                              "simulator takes num_gpu_blocks, num_cpu_blocks or "
                              "kv_cache_memory instead")
    check_holds_one_sequence(num_gpu_blocks, cache.block_size, config.scheduler.max_model_len,
                             source)


def checked_deployment(config: EngineConfig, num_gpu_blocks: int,
                       pools: Mapping[str, Any] | None) -> Deployment | None:
    """The pools file's deployment over `config` (None without one), once every KV pool
    the run would build is known to fit."""
    check_simulated_cache(config, num_gpu_blocks)
    deployment = None if pools is None else deployment_from(pools, config)
    for pool in deployment.pools if deployment else ():
        check_simulated_cache(pool.config, pool.config.cache.num_gpu_blocks or num_gpu_blocks,
                              f"pool {pool.name}: num_gpu_blocks")
    return deployment


@dataclass(frozen=True)
class PlannedRun:
    """One run with its KV pool and deployment checked: what `run_all` simulates."""

    spec: RunSpec
    num_gpu_blocks: int
    deployment: Deployment | None


def plan_runs(runs: Sequence[RunSpec], blocks_for_config: Callable[[EngineConfig], int],
              pools: Mapping[str, Any] | None = None) -> list[PlannedRun]:
    """Every run's KV pool sized and checked and its deployment built: before the first
    run starts, and before a workload file or trace is read (a wrong flag must not wait
    for a 200,000-line trace)."""
    planned = []
    for spec in runs:
        blocks = blocks_for_config(spec.config)
        planned.append(PlannedRun(spec, blocks, checked_deployment(spec.config, blocks, pools)))
    return planned


def simulate_run(name: str, config: EngineConfig, specs: Sequence[RequestSpec],
                 cost_model: CostModel, num_gpu_blocks: int,
                 closed_loop_concurrency: int | None, note: str = "",
                 progress: Callable[[int], None] | None = None,
                 pools: Mapping[str, Any] | None = None) -> tuple[RunResult, SimResult]:
    """One config on the simulator (over `pools`' deployment): its result, and the
    simulation for callers that need the requests (bench --sim)."""
    deployment = checked_deployment(config, num_gpu_blocks, pools)
    sim = simulate(config, specs, cost_model, num_gpu_blocks, closed_loop_concurrency,
                   progress=progress, deployment=deployment)
    return run_result(name, config, sim, note, deployment), sim


def run_config(name: str, config: EngineConfig, specs: Sequence[RequestSpec],
               cost_model: CostModel, num_gpu_blocks: int,
               closed_loop_concurrency: int | None, note: str = "",
               progress: Callable[[int], None] | None = None,
               pools: Mapping[str, Any] | None = None) -> RunResult:
    return simulate_run(name, config, specs, cost_model, num_gpu_blocks,
                        closed_loop_concurrency, note, progress, pools)[0]


@dataclass(frozen=True)
class BatchingComparison:
    """Continuous over static throughput, against the cap for the same request stream."""

    speedup: float
    speedup_cap: float
    share_of_cap: float
    static_slot_utilization_computed: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def batching_comparison(runs: list[RunResult], specs: Sequence[RequestSpec],
                        concurrency: int) -> BatchingComparison | None:
    """Static batches of `concurrency` in issue order; ideal = every slot busy."""
    by_mode = {r.batching: r.summary for r in runs}
    if "continuous" not in by_mode or "static" not in by_mode:
        return None
    continuous = by_mode["continuous"].throughput_tokens_per_s
    static = by_mode["static"].throughput_tokens_per_s
    assert continuous is not None and static, "a batching comparison needs both throughputs"
    speedup = continuous / static
    cap = speedup_for_lengths([s.output_len for s in specs], concurrency)
    return BatchingComparison(speedup, cap.speedup_cap, speedup / cap.speedup_cap,
                              cap.slot_utilization)


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    requests: int
    closed_loop_concurrency: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SimulateResult:
    """`stepserve simulate`'s result: a scenario's (or a workload file's) runs, the
    findings on each, and the batching comparison where the scenario asks for one."""

    scenario: str
    description: str
    cost_model: str
    workload: WorkloadInfo
    runs: list[RunResult]
    findings: list[Finding] = field(default_factory=list)
    comparison: BatchingComparison | None = None

    def to_json(self) -> dict[str, Any]:
        out = {SCHEMA_KEY: SCHEMA_VERSION, "scenario": self.scenario,
               "description": self.description, "cost_model": self.cost_model,
               "workload": self.workload.to_json(), "runs": [r.to_json() for r in self.runs],
               "findings": [f.to_json() for f in self.findings]}
        if self.comparison is not None:
            out["comparison"] = self.comparison.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "result") -> SimulateResult:
        """A simulate result of any version (fields it lacks read as empty)."""
        check_schema(data, where)
        w, comp = data.get("workload") or {}, data.get("comparison")
        return cls(
            scenario=str(data.get("scenario") or ""),
            description=str(data.get("description") or ""),
            cost_model=str(data.get("cost_model") or ""),
            workload=WorkloadInfo(str(w.get("name", "")), int(w.get("requests", 0)),
                                  w.get("closed_loop_concurrency")),
            runs=[RunResult.from_json(r, f"run {i}") for i, r in enumerate(data["runs"])],
            findings=[Finding.from_json(f) for f in data.get("findings") or []],
            comparison=None if comp is None else BatchingComparison(
                comp["speedup"], comp["speedup_cap"], comp["share_of_cap"],
                comp.get("static_slot_utilization_computed", 0.0)))


def run_scenario(scenario: Scenario, workload_overrides: WorkloadOverrides | None = None,
                 only: Sequence[str] | None = None,
                 progress_factory: Callable[[str, int], Callable[[int], None] | None]
                 | None = None, pools: Mapping[str, Any] | None = None) -> SimulateResult:
    runs = selected_runs(scenario, tuple(only)).runs if only else scenario.runs
    planned = plan_runs(runs, scenario.num_gpu_blocks, pools)
    workload = scenario.workload_with(workload_overrides)
    return run_all(scenario.name, scenario.description, workload, workload.generate(),
                   planned, scenario.cost_model(), scenario.compare_batching,
                   progress_factory)


def selected_runs(scenario: Scenario, names: tuple[str, ...] | None) -> Scenario:
    """The scenario with only the runs named (None: all); UsageError for another name."""
    if names is None:
        return scenario
    known = [r.name for r in scenario.runs]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--runs {','.join(names)}: scenario {scenario.name} has runs "
                         f"{', '.join(known)}")
    return replace(scenario, runs=tuple(r for r in scenario.runs if r.name in names))


def run_all(name: str, description: str, workload: Workload, specs: Sequence[RequestSpec],
            planned: Sequence[PlannedRun], cost_model: CostModel, compare: bool,
            progress_factory=None) -> SimulateResult:
    """Every run of `planned` (`plan_runs`) on the same requests, each over its
    deployment."""
    results = []
    for run in planned:
        spec = run.spec
        progress = progress_factory(spec.name, len(specs)) if progress_factory else None
        sim = simulate(spec.config, specs, cost_model, run.num_gpu_blocks,
                       workload.closed_loop_concurrency, progress=progress,
                       deployment=run.deployment)
        results.append(run_result(spec.name, spec.config, sim, spec.note, run.deployment))
    comparison = None
    if compare:
        concurrency = workload.closed_loop_concurrency or \
            planned[0].spec.config.scheduler.max_num_seqs
        comparison = batching_comparison(results, specs, concurrency)
    return SimulateResult(
        scenario=name, description=description, cost_model=cost_model.describe(),
        workload=WorkloadInfo(workload.name, len(specs), workload.closed_loop_concurrency),
        runs=results, findings=findings_for(results), comparison=comparison)
