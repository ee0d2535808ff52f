"""Running simulations and assembling their results in the shape other tools read:

    {"scenario", "description", "cost_model", "workload",
     "runs": [{"name", "batching", "config", "num_gpu_blocks", "summary", "by_class"}],
     "findings": [{"run", "rule", "severity", "evidence", "action"}],
     "comparison": {"speedup", "speedup_cap", "share_of_cap"}}   # batching comparisons
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stepserve.cli_errors import UsageError
from stepserve.config import EngineConfig
from stepserve.config_load import to_dict
from stepserve.limits import MAX_BLOCKS
from stepserve.metrics.alerts import findings_for
from stepserve.metrics.run_data import run_extras
from stepserve.metrics.summary import summarize, summarize_by_class
from stepserve.plan.speedup import speedup_for_lengths
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


def run_result(name: str, config: EngineConfig, sim: SimResult, note: str = "") -> dict:
    summary = summarize(sim.requests, sim.steps, sim.duration_s)
    summary.update(config_facts(config))
    run: dict[str, Any] = {"name": name, "batching": config.scheduler.batching,
                           "note": note, "config": to_dict(config),
                           "num_gpu_blocks": sim.num_gpu_blocks, "summary": summary}
    classes = {r.request_class for r in sim.requests}
    if len(classes) > 1:
        run["by_class"] = summarize_by_class(sim.requests, sim.steps, sim.duration_s)
    run.update(run_extras(sim))  # time series and latency samples for `stepserve report`
    run["_sim"] = sim  # dropped before JSON; kept for reports and tests
    return run


def check_num_gpu_blocks(config: EngineConfig, num_gpu_blocks: int) -> None:
    """The KV pool a run derives (from kv_cache_memory, or max_num_seqs x max_model_len)
    must hold a block and fit in memory: the block manager lists every free block."""
    if 1 <= num_gpu_blocks <= MAX_BLOCKS:
        return
    sc = config.scheduler
    raise UsageError(
        f"num_gpu_blocks = {num_gpu_blocks:,} (block_size {config.cache.block_size}, derived "
        f"from the KV cache size or max_num_seqs {sc.max_num_seqs} x max_model_len "
        f"{sc.max_model_len}): must be in [1, {MAX_BLOCKS:,}]; set num_gpu_blocks or "
        "kv_cache_memory, or change block_size, max_num_seqs or max_model_len")


def run_config(name: str, config: EngineConfig, specs: Sequence[RequestSpec],
               cost_model: CostModel, num_gpu_blocks: int,
               closed_loop_concurrency: int | None, note: str = "",
               progress: Callable[[int], None] | None = None) -> dict:
    check_num_gpu_blocks(config, num_gpu_blocks)
    sim = simulate(config, specs, cost_model, num_gpu_blocks, closed_loop_concurrency,
                   progress=progress)
    return run_result(name, config, sim, note)


def batching_comparison(runs: list[dict], specs: Sequence[RequestSpec],
                        concurrency: int) -> dict | None:
    """Continuous over static throughput, against the cap for the same request stream
    (static batches of `concurrency` in issue order; ideal = every slot busy)."""
    by_name = {r["batching"]: r["summary"] for r in runs}
    if "continuous" not in by_name or "static" not in by_name:
        return None
    speedup = (by_name["continuous"]["throughput_tokens_per_s"]
               / by_name["static"]["throughput_tokens_per_s"])
    cap = speedup_for_lengths([s.output_len for s in specs], concurrency)
    return {"speedup": speedup, "speedup_cap": cap.speedup_cap,
            "share_of_cap": speedup / cap.speedup_cap,
            "static_slot_utilization_computed": cap.slot_utilization}


def run_scenario(scenario: Scenario, workload_overrides: WorkloadOverrides | None = None,
                 only: Sequence[str] | None = None,
                 progress_factory: Callable[[str, int], Callable[[int], None] | None]
                 | None = None) -> dict:
    workload = scenario.workload_with(workload_overrides)
    specs = workload.generate()
    runs = [r for r in scenario.runs if not only or r.name in only]
    if only and len(runs) != len(only):
        known = ", ".join(r.name for r in scenario.runs)
        raise UsageError(f"--runs {','.join(only)}: scenario {scenario.name} has runs {known}")
    return run_all(scenario.name, scenario.description, workload, specs, runs,
                   scenario.cost_model(), scenario.num_gpu_blocks,
                   scenario.compare_batching, progress_factory)


def run_all(name: str, description: str, workload: Workload, specs: Sequence[RequestSpec],
            runs: Sequence[RunSpec], cost_model: CostModel,
            blocks_for_config: Callable[[EngineConfig], int], compare: bool,
            progress_factory=None) -> dict:
    for spec in runs:  # every run's KV pool, before the first run starts
        check_num_gpu_blocks(spec.config, blocks_for_config(spec.config))
    results = []
    for spec in runs:
        progress = progress_factory(spec.name, len(specs)) if progress_factory else None
        results.append(run_config(spec.name, spec.config, specs, cost_model,
                                  blocks_for_config(spec.config),
                                  workload.closed_loop_concurrency, spec.note, progress))
    out: dict[str, Any] = {"scenario": name, "description": description,
                           "cost_model": cost_model.describe(),
                           "workload": {"name": workload.name, "requests": len(specs),
                                        "closed_loop_concurrency":
                                            workload.closed_loop_concurrency},
                           "runs": results, "findings": findings_for(results)}
    if compare:
        concurrency = workload.closed_loop_concurrency or \
            runs[0].config.scheduler.max_num_seqs
        comparison = batching_comparison(results, specs, concurrency)
        if comparison:
            out["comparison"] = comparison
    return out


def to_json_ready(result: dict) -> dict:
    """Drop the in-memory simulation objects."""
    return {**result, "runs": [{k: v for k, v in r.items() if k != "_sim"}
                               for r in result["runs"]]}
