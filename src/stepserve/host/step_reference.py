"""How much slower steps run now than when the machine was quiet: N, the last WINDOW
steps' time over their shapes' quiet time. A shape (decode and prefill tokens, each up
to a power of two) has as quiet time its steps' 10th percentile, from a histogram of 5%
log bins (O(1) a step), once it has MIN_STEPS steps.

The reference is what this run has seen: a run contended from its first step understates
N (down to about 1); cpu_share.py's run-queue wait and others' CPU say that directly.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable

from stepserve.core.output import StepRecord

QUIET_QUANTILE = 0.10  # the fast end, not the minimum: one lucky step is no reference
MIN_STEPS = 8  # steps of a shape before its reference is trusted
WINDOW = 256  # recent steps N is taken over
_BIN = math.log(1.05)  # 5% wide bins
_MIN_S = 1e-6  # a step shorter than this is binned with it

Shape = tuple[int, int]


def power_of_two_bucket(n: int) -> int:
    """0 -> 0, else the least power of two >= n."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def shape_of(record: StepRecord) -> Shape:
    """(decode tokens, prefill tokens), each bucketed to a power of two."""
    return (power_of_two_bucket(record.num_decode_tokens),
            power_of_two_bucket(record.num_prefill_tokens))


class QuietStepReference:
    """The quiet time of each step shape and the recent steps' slowdown over it. Fed by
    one thread (the engine's, per step), read by another (a scrape): a lock keeps the
    two apart, and the per-step work is a dict increment and an append."""

    def __init__(self, window: int | None = WINDOW, min_steps: int = MIN_STEPS) -> None:
        self.min_steps = min_steps
        self._bins: dict[Shape, dict[int, int]] = {}
        self._counts: dict[Shape, int] = {}
        self._recent: deque[tuple[Shape, float]] = deque(maxlen=window)
        self._lock = threading.Lock()

    def add_all(self, records: Iterable[StepRecord]) -> None:
        for r in records:
            self.add(r)

    def add(self, record: StepRecord) -> None:
        shape, duration_s = shape_of(record), record.duration_s
        if not duration_s >= 0.0:  # NaN is no time
            return
        b = int(math.log(max(duration_s, _MIN_S)) // _BIN)
        with self._lock:
            bins = self._bins.setdefault(shape, {})
            bins[b] = bins.get(b, 0) + 1
            self._counts[shape] = self._counts.get(shape, 0) + 1
            self._recent.append((shape, duration_s))

    def reference_s(self, shape: Shape) -> float | None:
        """The shape's quiet step time (None: under min_steps steps seen)."""
        with self._lock:
            return self._reference(shape)

    def _reference(self, shape: Shape) -> float | None:
        count = self._counts.get(shape, 0)
        if count < self.min_steps:
            return None
        rank, seen = QUIET_QUANTILE * count, 0
        for b, n in sorted(self._bins[shape].items()):
            seen += n
            if seen >= rank:
                return math.exp((b + 0.5) * _BIN)  # the bin's middle (within 2.5%)
        raise AssertionError("a shape's bins hold its count")

    def over_quiet(self) -> float | None:
        """N: the recent steps' time over their shapes' quiet time; None before any
        shape has a reference."""
        with self._lock:
            refs: dict[Shape, float | None] = {}
            took = quiet = 0.0
            for shape, duration in self._recent:
                if shape not in refs:
                    refs[shape] = self._reference(shape)
                ref = refs[shape]
                if ref is not None:
                    took += duration
                    quiet += ref
            return took / quiet if quiet > 0 else None


def step_time_over_quiet(records: Iterable[StepRecord]) -> float | None:
    """N over a whole run's steps (a bench run), against the run's own quiet times."""
    reference = QuietStepReference(window=None)
    reference.add_all(records)
    return reference.over_quiet()
