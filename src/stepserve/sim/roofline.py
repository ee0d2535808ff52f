"""The roofline cost model: a step costs max(compute, memory traffic) plus overhead.

  compute = (2 x params x tokens + attention FLOPs) / (peak FLOP/s x MFU)
  memory  = (weights + KV read + KV written) / (bandwidth x MBU)

Attention FLOPs for a chunk of n new tokens after `start` cached ones:
4 x layers x heads x head_dim x n x (start + (n + 1) / 2)  (QK^T and PV, causal).
Decode is memory-bound (weights are read once per step, whatever the batch), prefill is
compute-bound: that is why continuous batching's gain on a GPU is close to the step-count
gain, and why a CPU (where compute grows with batch) sees less of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.core.output import SchedulerOutput
from stepserve.plan.model_specs import ModelSpec
from stepserve.sim.cost import CostModel, causal_pairs, computed_tokens
from stepserve.sim.hardware import HardwareSpec


@dataclass(frozen=True)
class RooflineCost(CostModel):
    hardware: HardwareSpec
    model: ModelSpec
    name = "roofline"

    def __post_init__(self) -> None:
        m, hw = self.model, self.hardware
        object.__setattr__(self, "_flops_per_token", 2.0 * m.num_params)
        object.__setattr__(self, "_attn_coeff", 4.0 * m.num_layers * m.num_heads * m.head_dim)
        object.__setattr__(self, "_flops_rate", hw.peak_flops * hw.flops_efficiency)
        object.__setattr__(self, "_byte_rate", hw.memory_bandwidth * hw.bandwidth_efficiency)

    def step_time(self, out: SchedulerOutput) -> float:
        counts = out.num_scheduled_tokens
        starts = computed_tokens(out)
        tokens = sum(counts)
        return self._time(tokens, causal_pairs(counts, starts), sum(starts) + tokens)

    def decode_step_time(self, batch: int, computed: int) -> float:
        # causal_pairs of `batch` one-token chunks: computed + batch, as is the context
        return self._time(batch, computed + batch, computed + batch)

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
