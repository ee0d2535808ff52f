"""The roofline cost model: a step costs max(compute, memory traffic) plus overheads.

  compute = (2 x params x tokens + attention FLOPs) / (peak FLOP/s x MFU)
  memory  = (weights + KV read + KV written) / (bandwidth x MBU)
  swap    = KV blocks copied x block bytes / host link bandwidth
  step    = fixed overhead + scheduling overhead + swap + max(compute, memory)

Attention FLOPs for a chunk of n new tokens after `start` cached ones:
4 x layers x heads x head_dim x n x (start + (n + 1) / 2)  (QK^T and PV, causal).
Decode is memory-bound (weights are read once per step, whatever the batch), prefill is
compute-bound: that is why continuous batching's gain on a GPU is close to the step-count
gain, and why a CPU (where compute grows with batch) sees less of it. Block copies come
before the forward pass (core/output.py), so their time adds to the step's.
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
from stepserve.sim.hardware import HardwareSpec


@dataclass(frozen=True)
class RooflineCost(CostModel):
    hardware: HardwareSpec
    model: ModelSpec
    block_size: int = 16  # tokens per KV block: what one swapped block carries
    name = "roofline"

    def __post_init__(self) -> None:
        m, hw = self.model, self.hardware
        object.__setattr__(self, "_flops_per_token", 2.0 * m.num_params)
        object.__setattr__(self, "_attn_coeff", 4.0 * m.num_layers * m.num_heads * m.head_dim)
        object.__setattr__(self, "_flops_rate", hw.peak_flops * hw.flops_efficiency)
        object.__setattr__(self, "_byte_rate", hw.memory_bandwidth * hw.bandwidth_efficiency)
        object.__setattr__(self, "_overhead",
                           SchedulingOverhead(hw.seq_overhead_s, hw.join_overhead_s))
        object.__setattr__(self, "_block_copy_s", self.block_size * m.kv_bytes_per_token
                           / hw.host_link_bandwidth)

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
