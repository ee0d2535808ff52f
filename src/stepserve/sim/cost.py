"""Cost models: how long one step takes, given the batch.

* ConstantCost: every step takes the same time (the seed's 24-26 ms engine step).
* RooflineCost: max(compute time, memory time) + a fixed overhead, from a hardware spec
  (peak FLOP/s, memory bandwidth, efficiencies) and a model spec (parameters, layers,
  KV layout). Prefill is compute-bound, small-batch decode is memory-bound: this is why
  a continuous batch of 64 costs a GPU about what a batch of 10 does.
* CalibratedCost (calibrated.py): a fit of this machine's measured step times, from
  `stepserve profile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, mul

from stepserve.core.output import SchedulerOutput

_COMPUTED = attrgetter("num_computed_tokens")


def computed_tokens(out: SchedulerOutput) -> list[int]:
    """Each scheduled request's tokens already computed (where its chunk starts)."""
    return list(map(_COMPUTED, out.requests))


def causal_pairs(counts: Sequence[int], starts: Sequence[int]) -> int:
    """Query x key pairs of causal attention: n new tokens after `start` computed ones
    attend to start + 1 .. start + n keys, n * start + n (n + 1) / 2 in all. Summed with
    map() at C speed: the cost models run this for every step of a simulation."""
    return sum(map(mul, counts, starts)) + (sum(map(mul, counts, counts)) + sum(counts)) // 2


class CostModel:
    name = ""

    def step_time(self, out: SchedulerOutput) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def decode_step_time(self, batch: int, computed: int) -> float | None:
        """Exactly what `step_time` returns for a step of `batch` decodes whose requests
        hold `computed` computed tokens in all (a decode run's steps, core/decode_run.py);
        None where a model cannot tell without the batch (the simulator then steps)."""
        return None

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class ConstantCost(CostModel):
    seconds_per_step: float = 0.025
    name = "constant"

    def step_time(self, out: SchedulerOutput) -> float:
        return self.seconds_per_step

    def decode_step_time(self, batch: int, computed: int) -> float:
        return self.seconds_per_step

    def describe(self) -> str:
        return f"constant {self.seconds_per_step * 1000:g} ms per step"
