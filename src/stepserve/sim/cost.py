"""Cost models: how long one step takes, given the batch.

* ConstantCost: every step takes the same time (the seed's 24-26 ms engine step).
* RooflineCost: max(compute time, memory time) + a fixed overhead, from a hardware spec
  (peak FLOP/s, memory bandwidth, efficiencies) and a model spec (parameters, layers,
  KV layout). Prefill is compute-bound, small-batch decode is memory-bound: this is why
  a continuous batch of 64 costs a GPU about what a batch of 10 does.
* LinearCost: a fit of measured step times, t = a + b * tokens + c * context_tokens
  (calibrate it from your own engine's step times).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.core.output import SchedulerOutput


class CostModel:
    name = ""

    def step_time(self, out: SchedulerOutput) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class ConstantCost(CostModel):
    seconds_per_step: float = 0.025
    name = "constant"

    def step_time(self, out: SchedulerOutput) -> float:
        return self.seconds_per_step

    def describe(self) -> str:
        return f"constant {self.seconds_per_step * 1000:g} ms per step"


def context_tokens(out: SchedulerOutput) -> int:
    """KV tokens attention reads in this step: each sequence's context after the step."""
    total = 0
    for req, n in zip(out.requests, out.num_scheduled_tokens):
        total += req.num_computed_tokens + n
    return total


@dataclass(frozen=True)
class LinearCost(CostModel):
    base_s: float
    per_token_s: float
    per_context_token_s: float = 0.0
    name = "linear"

    def step_time(self, out: SchedulerOutput) -> float:
        t = self.base_s + self.per_token_s * out.total_num_scheduled_tokens
        if self.per_context_token_s:
            t += self.per_context_token_s * context_tokens(out)
        return t

    def describe(self) -> str:
        return (f"linear: {self.base_s * 1e3:g} ms + {self.per_token_s * 1e6:g} us/token + "
                f"{self.per_context_token_s * 1e9:g} ns/context token")
