"""The roofline cost model: a step costs max(compute, memory traffic) plus overheads.

  compute = (2 x params x tokens + attention FLOPs) / (peak FLOP/s x MFU)
  memory  = (weights + KV read + KV written) / (bandwidth x MBU)
  step    = fixed overhead + scheduling overhead + swap + max(compute, memory)

with attention 4 x layers x heads x head_dim x n x (start + (n + 1) / 2) for a chunk of
n tokens after `start` cached ones, and a swap its blocks' bytes over the host link
(PCIe Gen5 x16 copies reach about 50 GB/s, Gen4 about 25). Presets (`HARDWARE`): the
vendors' dense bf16 FLOP/s and bandwidth; the efficiencies are assumptions, printed with
every result.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.core.output import SchedulerOutput
from stepserve.plan.model_specs import ModelSpec
from stepserve.sim.cost import (
    CostModel,
    SchedulingOverhead,
    causal_pairs,
    computed_tokens,
    joining,
)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_bytes: int
    flops_efficiency: float = 0.5  # share of peak FLOP/s reached in prefill (MFU)
    bandwidth_efficiency: float = 0.7  # share of peak bandwidth reached in decode (MBU)
    step_overhead_s: float = 0.004  # scheduling, sampling, launch: per step, fixed
    memory_utilization: float = 0.9  # share of memory the engine may use (weights + KV)
    host_link_bandwidth: float = 25e9  # bytes/s a device <-> host KV copy reaches
    # An engine that overlaps scheduling with the GPU (vLLM v1) hides its per-sequence and
    # per-join work; one that does not pays it every step (sim/cost.py SchedulingOverhead).
    seq_overhead_s: float = 0.0  # per scheduled sequence
    join_overhead_s: float = 0.0  # per request joining the batch

    def describe(self) -> str:
        extra = "".join(
            f" + {seconds * 1e6:g} us/{unit}" for seconds, unit in (
                (self.seq_overhead_s, "sequence"), (self.join_overhead_s, "join"))
            if seconds)
        return (f"{self.name}: {self.peak_flops / 1e12:g} TFLOP/s x {self.flops_efficiency:g}, "
                f"{self.memory_bandwidth / 1e12:g} TB/s x {self.bandwidth_efficiency:g}, "
                f"{self.memory_bytes / 1e9:g} GB x {self.memory_utilization:g}, "
                f"{self.step_overhead_s * 1e3:g} ms/step overhead{extra}, "
                f"host link {self.host_link_bandwidth / 1e9:g} GB/s")


_GB = 10**9
HARDWARE: dict[str, HardwareSpec] = {h.name: h for h in (
    HardwareSpec("h100", 989e12, 3.35e12, 80 * _GB, host_link_bandwidth=50e9),
    HardwareSpec("h200", 989e12, 4.8e12, 141 * _GB, host_link_bandwidth=50e9),
    HardwareSpec("a100", 312e12, 2.039e12, 80 * _GB),
    HardwareSpec("a100-40gb", 312e12, 1.555e12, 40 * _GB),
    HardwareSpec("l40s", 362e12, 0.864e12, 48 * _GB),
    # This project's CI machine kind: 2 cores, ~23 GB/s measured (DESIGN.md section 3); a
    # "swap" there is a copy within host memory, reading and writing: half of that.
    HardwareSpec("cpu-2core", 1.0e11, 23e9, 24 * _GB, flops_efficiency=0.5,
                 bandwidth_efficiency=0.8, step_overhead_s=0.003, memory_utilization=0.5,
                 host_link_bandwidth=11.5e9),
)}


def get_hardware(name: str) -> HardwareSpec:
    hw = HARDWARE.get(name.strip().lower())
    if hw is None:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return hw


@dataclass(frozen=True)
class RooflineCost(CostModel):
    hardware: HardwareSpec
    model: ModelSpec
    block_size: int = 16  # tokens per KV block: what one swapped block carries
    name = "roofline"

    def __post_init__(self) -> None:
        m, hw = self.model, self.hardware
        derived = {
            "_flops_per_token": 2.0 * m.num_params,
            "_attn_coeff": 4.0 * m.num_layers * m.num_heads * m.head_dim,
            "_flops_rate": hw.peak_flops * hw.flops_efficiency,
            "_byte_rate": hw.memory_bandwidth * hw.bandwidth_efficiency,
            "_overhead": SchedulingOverhead(hw.seq_overhead_s, hw.join_overhead_s),
            "_block_copy_s": self.block_size * m.kv_bytes_per_token / hw.host_link_bandwidth}
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def step_time(self, out: SchedulerOutput) -> float:
        counts = out.num_scheduled_tokens
        starts = computed_tokens(out)
        tokens = sum(counts)
        extra = self._overhead.time(len(counts), joining(starts))
        if out.swap_in or out.swap_out:
            extra += self.swap_time(len(out.swap_in) + len(out.swap_out))
        return extra + self._time(tokens, causal_pairs(counts, starts), sum(starts) + tokens)

    def decode_step_time(self, batch: int, computed: int) -> float:
        # causal_pairs of `batch` one-token chunks: computed + batch, as is the context
        return self._overhead.per_seq_s * batch + \
            self._time(batch, computed + batch, computed + batch)

    def swap_time(self, blocks: int) -> float:
        """Seconds to copy `blocks` KV blocks one way over the host link."""
        return blocks * self._block_copy_s

    def recompute_time(self, tokens: int) -> float:
        """Seconds of the compute a recomputed prefill of `tokens` tokens takes (the
        other price of an eviction; with the weights read anyway, compute is its cost)."""
        flops = self._flops_per_token * tokens + self._attn_coeff * tokens * (tokens + 1) / 2
        return flops / self._flops_rate

    def _time(self, tokens: int, attn: int, context: int) -> float:
        """The step's time from its integer work counts (one formula for both paths)."""
        flops = self._flops_per_token * tokens + self._attn_coeff * attn
        bytes_moved = self.model.weight_bytes + context * self.model.kv_bytes_per_token
        compute = flops / self._flops_rate
        memory = bytes_moved / self._byte_rate
        return self.hardware.step_overhead_s + (compute if compute > memory else memory)

    def kv_cache_bytes(self) -> int:
        """Memory left for KV after the weights, within memory_utilization."""
        hw = self.hardware
        return max(int(hw.memory_bytes * hw.memory_utilization) - self.model.weight_bytes, 0)

    def describe(self) -> str:
        return f"roofline on {self.hardware.describe()}; model {self.model.name}"
