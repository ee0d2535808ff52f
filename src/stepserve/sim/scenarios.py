"""The seed's incidents and quick-start configs as runnable simulations.

A Scenario is a workload, a cost model, a KV size and the configs to compare: the
seed's config (`before`) and its fix (`after`), or the three batching modes, or A/B/C.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepserve.config import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost, CostModel, SchedulingOverhead
from stepserve.sim.hardware import get_hardware
from stepserve.sim.kv_sizing import num_gpu_blocks_for
from stepserve.sim.roofline import RooflineCost
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.scenarios import get_workload
from stepserve.workload.spec import Workload

_BASE = EngineConfig()


def cfg(**settings) -> EngineConfig:
    return _BASE.replace(**settings)


@dataclass(frozen=True)
class RunSpec:
    name: str
    config: EngineConfig
    note: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: Callable[[], Workload]  # the built-in workload, before any override
    cost_model: Callable[[], CostModel]
    runs: tuple[RunSpec, ...]
    kv_cache_bytes: int | None = None  # with kv_bytes_per_token: device blocks
    kv_bytes_per_token: int | None = None
    compare_batching: bool = False  # add continuous-vs-static speedup and its cap
    defaults: WorkloadOverrides = WorkloadOverrides()  # workload overrides used by default

    def workload_with(self, overrides: WorkloadOverrides | None = None) -> Workload:
        """The workload with the scenario's defaults, then `overrides`, applied."""
        return override_workload(self.workload(),
                                 self.defaults.merged(overrides or WorkloadOverrides()))

    def num_gpu_blocks(self, config: EngineConfig) -> int:
        """KV blocks per replica (sim/kv_sizing.py): the config's num_gpu_blocks, else
        from the scenario's KV size, else max_num_seqs sequences of max_model_len."""
        return num_gpu_blocks_for(config, self.kv_cache_bytes, self.kv_bytes_per_token)


# The night-report engine: its steps took 24-26 ms under static batching, where after
# step 20 only 10 sequences run. 24 ms of model work, 0.1 ms per scheduled sequence and
# 1 ms per request joining the batch make that 25 ms, and a continuous batch's step
# (64 sequences) 30.4 ms: what re-forming the batch every step costs.
NIGHT_REPORT_COST = ConstantCost(0.024, SchedulingOverhead(per_seq_s=1e-4, per_join_s=1e-3))


def _night_report() -> Scenario:
    common = dict(max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=4096)
    return Scenario(
        name="night-report",
        description=("The night-report incident: a nightly report job, 64 in flight, every "
                     "round 54 x 20 + 10 x 2,000 output tokens, on an engine whose step is "
                     "24 ms plus its scheduling overhead: static 64-slot batching vs dynamic "
                     "(64 / 50 ms) vs continuous."),
        workload=lambda: get_workload("night-report"),
        cost_model=lambda: NIGHT_REPORT_COST,
        runs=(RunSpec("static", cfg(batching="static", **common)),
              RunSpec("dynamic", cfg(batching="dynamic", batch_window_s=0.05, **common)),
              RunSpec("continuous", cfg(batching="continuous", **common))),
        compare_batching=True,
    )


def _seed_gpu_cost() -> RooflineCost:
    # Llama-3-8B on an H100: a 2,048-token prefill chunk ~0.07 s, a 32,768-token step
    # ~1.3 s, a decode step ~10-20 ms; ~430k tokens of KV.
    return RooflineCost(get_hardware("h100"), get_model_spec("llama-3-8b"))


def _mixed_pool() -> Scenario:
    bad = cfg(max_num_seqs=256, max_num_batched_tokens=32768, enable_chunked_prefill=True,
              long_prefill_token_threshold=32768, max_num_partial_prefills=4,
              max_long_partial_prefills=4, budget_order="prefill_first", max_model_len=8704)
    fixed = bad.replace(max_num_batched_tokens=8192, long_prefill_token_threshold=2048,
                        max_num_partial_prefills=1, max_long_partial_prefills=1,
                        budget_order="decode_first")
    return Scenario(
        name="mixed-pool",
        description=("Seed incident 2: 30% 8K summaries + 70% 300-token chats; before: budget "
                     "32768 with the chunk cap equal to it and prompts first; after: budget "
                     "8192, chunk cap 2048, one partial prefill, decode first."),
        workload=lambda: get_workload("mixed-pool"),
        cost_model=_seed_gpu_cost,
        runs=(RunSpec("before", bad, "chunk cap = budget = 32768, prefill_first"),
              RunSpec("after", fixed, "budget 8192, chunk cap 2048, decode_first")),
        kv_cache_bytes=_seed_gpu_cost().kv_cache_bytes(),
        kv_bytes_per_token=get_model_spec("llama-3-8b").kv_bytes_per_token,
        # ~80% of this engine's prefill capacity: bursts queue prompts, as in the seed.
        defaults=WorkloadOverrides(rate=6.0),
    )


def _promo_spike() -> Scenario:
    spec = get_model_spec("qwen2.5-14b")  # 192 KiB of KV per token, the seed's figure
    before = cfg(replicas=2, max_num_seqs=128, max_num_batched_tokens=8192,
                 max_model_len=4096, policy="priority", preemption_mode="recompute",
                 watermark=0.0)
    after = before.replace(replicas=3, max_num_seqs=40, max_waiting=24, aging_after_s=20.0)
    return Scenario(
        name="promo-spike",
        description=("Seed incident 3: a promotion spike at ~980 req/min, mean output ~280 "
                     "with a long tail, 38 GB of KV per replica at 192 KiB/token; before: 2 "
                     "replicas x max_num_seqs 128; after: 3 replicas, max_num_seqs 40, "
                     "max_waiting 24, aging 20 s."),
        workload=lambda: get_workload("promo-spike"),
        cost_model=lambda: RooflineCost(get_hardware("h100"), spec),
        runs=(RunSpec("before", before, "2 replicas, max_num_seqs 128, no queue cap"),
              RunSpec("after", after, "3 replicas, max_num_seqs 40, max_waiting 24, aging 20 s")),
        kv_cache_bytes=38 * 10**9, kv_bytes_per_token=spec.kv_bytes_per_token,
    )


def _quickstart() -> Scenario:
    spec = get_model_spec("llama-3-8b")
    cost = RooflineCost(get_hardware("h100"), spec)
    return Scenario(
        name="quickstart",
        description=("Seed quick start: one fixed load against A (small budget, moderate "
                     "max_num_seqs), B (both large), C (chunked prefill, capped chunk and "
                     "request length) on an H100 with Llama-3-8B."),
        workload=lambda: get_workload("quickstart"),
        cost_model=lambda: cost,
        runs=(RunSpec("A", cfg(max_num_batched_tokens=2048, max_num_seqs=64,
                               max_model_len=4096), "low latency"),
              RunSpec("B", cfg(max_num_batched_tokens=16384, max_num_seqs=512,
                               max_model_len=4096), "high throughput"),
              RunSpec("C", cfg(max_num_batched_tokens=8192, max_num_seqs=128,
                               long_prefill_token_threshold=1024, max_model_len=4096),
                      "chunked, capped")),
        kv_cache_bytes=cost.kv_cache_bytes(), kv_bytes_per_token=spec.kv_bytes_per_token,
        # Loaded enough that the three differ: A queues (its budget caps prefill), B has
        # the best throughput and the worst TPOT, C the steadiest tail.
        defaults=WorkloadOverrides(rate=24.0),
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "night-report": _night_report,
    "mixed-pool": _mixed_pool,
    "promo-spike": _promo_spike,
    "quickstart": _quickstart,
}


def get_scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]()
