"""The three incidents and the quick start as runnable simulations: a Scenario is a
workload, a cost model, a KV size and the configs to compare (before/after, the batching
modes, or A/B/C). docs/guide.md says how the sizes were chosen; sim/report.py holds the
figures each must reproduce."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_BLOCKS
from stepserve.config.settings import EngineConfig
from stepserve.core.base import check_holds_one_sequence
from stepserve.core.kv_cache import blocks_for
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.cost import ConstantCost, CostModel, SchedulingOverhead
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.workload.builtin import get_workload
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.spec import Workload

_BASE = EngineConfig()


def cfg(**settings) -> EngineConfig:
    return _BASE.replace(**settings)


def num_gpu_blocks_for(config: EngineConfig, kv_cache_bytes: int | None = None,
                       kv_bytes_per_token: int | None = None) -> int:
    """KV blocks per simulated replica: the config's num_gpu_blocks; else a KV size (its
    kv_cache_memory, else `kv_cache_bytes`) over `kv_bytes_per_token` x block_size; else
    max_num_seqs sequences of max_model_len. Derived and checked here, in one place, so
    the count checked is the count used: UsageError, naming the inputs, for more than
    MAX_BLOCKS or fewer than one sequence of max_model_len needs."""
    cache, sc = config.cache, config.scheduler
    bs = cache.block_size
    if cache.num_gpu_blocks:  # bounded by its own setting's range
        blocks, source = cache.num_gpu_blocks, "cache.num_gpu_blocks"
    elif (kv_bytes := cache.kv_cache_memory or kv_cache_bytes) and kv_bytes_per_token:
        whose = "kv_cache_memory" if cache.kv_cache_memory else "the cost model's KV cache"
        blocks = kv_bytes // (kv_bytes_per_token * bs)
        source = (f"num_gpu_blocks (from {whose} of {kv_bytes:,} bytes at "
                  f"{kv_bytes_per_token:,} bytes a token)")
        if blocks > MAX_BLOCKS:
            raise UsageError(
                f"{source} = {blocks:,} blocks of {bs} tokens: the simulator holds at most "
                f"{MAX_BLOCKS:,}; set num_gpu_blocks, a smaller kv_cache_memory or a larger "
                "block_size")
    else:  # room for every sequence at its longest
        per_sequence = blocks_for(sc.max_model_len, bs)
        blocks = per_sequence * sc.max_num_seqs
        if blocks > MAX_BLOCKS:
            raise UsageError(
                f"max_num_seqs {sc.max_num_seqs:,} x max_model_len {sc.max_model_len:,} "
                f"(block_size {bs}): {blocks:,} KV blocks, {per_sequence:,} a sequence; the "
                f"simulator holds at most {MAX_BLOCKS:,}, so at most max_num_seqs "
                f"{MAX_BLOCKS // per_sequence:,} at this max_model_len and block_size; or "
                "set num_gpu_blocks or kv_cache_memory")
        return blocks  # max_num_seqs >= 1: one sequence fits
    check_holds_one_sequence(blocks, bs, sc.max_model_len, source)
    return blocks


@dataclass(frozen=True)
class RunSpec:
    """One named engine config: a scenario's run, or a sweep's series."""

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
        """KV blocks per replica (`num_gpu_blocks_for`)."""
        return num_gpu_blocks_for(config, self.kv_cache_bytes, self.kv_bytes_per_token)


# The night report's 24-26 ms static steps (10 sequences after step 20): 24 ms of work,
# 0.1 ms a sequence and 1 ms a join; a continuous step of 64 sequences then takes 30.4 ms.
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


def _mixed_pool_cost() -> RooflineCost:
    # a 300-token prefill ~0.065 s, a 2,048-token chunk ~0.4 s (the incident's), ~216k KV
    return RooflineCost(get_hardware("a100"), get_model_spec("qwen2.5-14b"))


def _mixed_pool() -> Scenario:
    bad = cfg(max_num_seqs=256, max_num_batched_tokens=32768, enable_chunked_prefill=True,
              long_prefill_token_threshold=32768, max_num_partial_prefills=4,
              max_long_partial_prefills=4, budget_order="prefill_first", max_model_len=8704)
    fixed = bad.replace(max_num_batched_tokens=8192, long_prefill_token_threshold=2048,
                        max_num_partial_prefills=1, max_long_partial_prefills=1,
                        budget_order="decode_first")
    spec = get_model_spec("qwen2.5-14b")
    return Scenario(
        name="mixed-pool",
        description=("The mixed-pool incident: 30% 8K summaries + 70% 300-token chats at 0.8 "
                     "req/s on Qwen2.5-14B / A100; before: budget 32768 with the chunk cap "
                     "equal to it and prompts first; after: budget 8192, chunk cap 2048, one "
                     "partial prefill, decode first."),
        workload=lambda: get_workload("mixed-pool"),
        cost_model=_mixed_pool_cost,
        runs=(RunSpec("before", bad, "chunk cap = budget = 32768, prefill_first"),
              RunSpec("after", fixed, "budget 8192, chunk cap 2048, decode_first")),
        kv_cache_bytes=_mixed_pool_cost().kv_cache_bytes(),
        kv_bytes_per_token=spec.kv_bytes_per_token,
    )


def _promo_spike() -> Scenario:
    spec = get_model_spec("qwen2.5-14b")  # 192 KiB of KV per token, the incident's figure
    # the pool's max_num_seqs 128 is 64 a replica: 128 run while 140 are in flight
    before = cfg(replicas=2, max_num_seqs=64, max_num_batched_tokens=8192,
                 max_model_len=4096, policy="priority", preemption_mode="recompute",
                 aging_after_s=0.0)  # no aging before the fix
    after = before.replace(replicas=3, max_num_seqs=40, max_waiting=24, aging_after_s=20.0)
    return Scenario(
        name="promo-spike",
        description=("The promo-spike incident: from 20:00 arrivals rise from 660 to 980 "
                     "req/min, mean output ~280 with a long tail (6% over 1,200 tokens, low "
                     "priority), Qwen2.5-14B on H100s, 38 GB of KV per replica at 192 "
                     "KiB/token; before: 2 replicas x max_num_seqs 64 (128 for the pool); "
                     "after: 3 replicas, max_num_seqs 40, max_waiting 24, aging 20 s."),
        workload=lambda: get_workload("promo-spike"),
        cost_model=lambda: RooflineCost(get_hardware("h100"), spec),
        runs=(RunSpec("before", before, "2 replicas x 64 (pool 128), no queue cap"),
              RunSpec("after", after, "3 replicas, max_num_seqs 40, max_waiting 24, aging 20 s")),
        kv_cache_bytes=38 * 10**9, kv_bytes_per_token=spec.kv_bytes_per_token,
    )


def _quickstart() -> Scenario:
    spec = get_model_spec("llama-3-8b")
    cost = RooflineCost(get_hardware("h100"), spec)
    return Scenario(
        name="quickstart",
        description=("The quick start: one fixed load (8 req/s, below A's knee) against A "
                     "(small budget 512, moderate max_num_seqs 64), B (both large: 16384, "
                     "512), C (budget 8192, chunk cap 1024 per request, max_model_len 4096) "
                     "on an H100 with Llama-3-8B. " + QUICKSTART_KNEES),
        workload=lambda: get_workload("quickstart"),
        cost_model=lambda: cost,
        runs=(RunSpec("A", cfg(max_num_batched_tokens=512, max_num_seqs=64,
                               max_model_len=4096), "small budget: low latency"),
              RunSpec("B", cfg(max_num_batched_tokens=16384, max_num_seqs=512,
                               max_model_len=4096), "both large: throughput"),
              RunSpec("C", cfg(max_num_batched_tokens=8192, max_num_seqs=128,
                               long_prefill_token_threshold=1024, max_model_len=4096),
                      "chunked, capped: steady")),
        kv_cache_bytes=cost.kv_cache_bytes(), kv_bytes_per_token=spec.kv_bytes_per_token,
    )


# Where each quick-start claim stops holding, from `stepserve sweep --scenario quickstart
# --vary rate=...` (docs/guide.md has the table).
QUICKSTART_KNEES = (
    "At 8 req/s all three carry the load: A has the lowest TPOT and ITL, B the worst tail. "
    "A's claim stops at its knee, 16 req/s (its TTFT P99 8.7 s at 20: prompts wait for its "
    "small budget, though its TPOT stays lowest); B's higher throughput shows only past "
    "it (knees: C 20, B 24 req/s). C's ITL is steadier than B's at every rate, never than "
    "A's (stepserve sweep --scenario quickstart --vary rate=4,8,12,16,20,24,32,48).")


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
