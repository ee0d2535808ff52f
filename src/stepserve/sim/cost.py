"""Cost models: how long one step takes, given the batch. ConstantCost here,
RooflineCost (roofline.py), CalibratedCost (calibrated.py, fitted by `stepserve profile`).

Each adds the engine's scheduling overhead (`SchedulingOverhead`), which grows with the
batch re-formed each step: a continuous batch's steps carry every sequence, a static
batch's only its live ones, so continuous batching's gain stays below the step-count cap.
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
    """Query x key pairs of causal attention, n * start + n (n + 1) / 2 per chunk (map():
    C speed, every step)."""
    return sum(map(mul, counts, starts)) + (sum(map(mul, counts, counts)) + sum(counts)) // 2


def joining(starts: list[int]) -> int:
    """Requests joining the batch, from each one's computed tokens: those at 0."""
    return starts.count(0)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} us"


@dataclass(frozen=True)
class SchedulingOverhead:
    """The engine's own work in a step: `per_seq_s` per scheduled sequence (its pass,
    inputs row, sampling), `per_join_s` per request joining the batch from its first
    token (set up and torn down: one charge; a swap-in pays its copies instead). Decode
    steps have no joins, so decode runs price the same as stepping."""

    per_seq_s: float = 0.0
    per_join_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_seq_s", "per_join_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 10.0):
                raise ValueError(f"scheduling overhead {name} = {value!r}: must be seconds "
                                 "in [0, 10)")

    def time(self, seqs: int, joins: int) -> float:
        return self.per_seq_s * seqs + self.per_join_s * joins

    def describe(self) -> str:
        """'' when there is none; else how it is charged, e.g. for `cost model: ...`."""
        parts = [f"{_ms(self.per_seq_s)} per scheduled sequence"] if self.per_seq_s else []
        if self.per_join_s:
            parts.append(f"{_ms(self.per_join_s)} per request joining the batch")
        return f"scheduling overhead {' + '.join(parts)}" if parts else ""


NO_OVERHEAD = SchedulingOverhead()


class CostModel:
    name = ""

    def step_time(self, out: SchedulerOutput) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def decode_step_time(self, batch: int, computed: int) -> float | None:
        """Exactly `step_time` of `batch` decodes holding `computed` tokens in all (decode
        runs); None where the batch is needed (the simulator then steps)."""
        return None

    def for_replica(self, index: int) -> CostModel:
        """The model one replica of one simulation prices its steps with: itself, for
        a deterministic model; a fresh seeded draw stream for a spread (sim/spread.py)."""
        return self

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class ConstantCost(CostModel):
    seconds_per_step: float = 0.025
    overhead: SchedulingOverhead = NO_OVERHEAD
    name = "constant"

    def step_time(self, out: SchedulerOutput) -> float:
        overhead = self.overhead
        if not overhead.per_join_s:  # the usual case: no pass over the batch
            return self.seconds_per_step + overhead.per_seq_s * len(out.requests)
        return self.seconds_per_step + overhead.time(len(out.requests),
                                                     joining(computed_tokens(out)))

    def decode_step_time(self, batch: int, computed: int) -> float:
        return self.seconds_per_step + self.overhead.per_seq_s * batch

    def describe(self) -> str:
        extra = self.overhead.describe()
        return f"constant {self.seconds_per_step * 1000:g} ms per step" + (
            f" + {extra}" if extra else "")
