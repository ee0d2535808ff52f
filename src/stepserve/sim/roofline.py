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
from operator import attrgetter, mul

from stepserve.core.output import SchedulerOutput
from stepserve.plan.model_specs import ModelSpec
from stepserve.sim.cost import CostModel
from stepserve.sim.hardware import HardwareSpec

_COMPUTED = attrgetter("num_computed_tokens")


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
        # Per request: n new tokens after `start` computed ones attend to start + 1 ..
        # start + n keys: n * start + n (n + 1) / 2 in all (an integer). Summed with
        # map() at C speed: this runs for every step of a simulation.
        counts = out.num_scheduled_tokens
        starts = list(map(_COMPUTED, out.requests))
        tokens = sum(counts)
        attn = sum(map(mul, counts, starts)) + (sum(map(mul, counts, counts)) + tokens) // 2
        context = sum(starts) + tokens
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
