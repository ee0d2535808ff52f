"""How many CPU threads a step runs on: the cores other processes leave free.

A decode step is a chain of ~300 small products, each shared out over one OpenMP team
and closed by a barrier. Beside one busy process on 2 cores, the scheduler keeps one of
the two threads off a core for a whole time slice at a time; the other reaches the next
barrier within ~30 us and spins there, so the step only moves while both threads hold a
core at once (measured, default model, batch 1: 12 ms a step quiet, 29-36 ms median and
120-150 ms P90 with two threads beside a busy loop, 21.5 ms with one thread, every step
alike). Waits that sleep instead of spinning made it worse (54-87 ms: each wake-up
queues behind the busy process). So a step runs on as many threads as there are cores
nobody else is using: the busy CPU time of other processes at normal priority, from
/proc/stat, over the last window (engine/cpu_share.py). Processes at positive nice do not count: our threads
preempt them (a compile at nice 19 leaves the team whole).

`threads` fixed by the user (`--threads`, or OMP_NUM_THREADS) is kept as it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from stepserve.engine.cpu_share import CpuShareSampler, usable_cpus

# A team shrinks by a thread once others take more than SHRINK_AT of the cores it runs
# on (one busy loop beside a 2-thread team gets its fair 0.67 of a core), and grows back
# only onto a core at most GROW_AT busy, so a load near the line (a benchmark client's
# ~0.3 cores) does not flip it every window.
SHRINK_AT = 0.5
GROW_AT = 0.25
WINDOW_S = 0.5  # how long others' CPU time is averaged over before a decision


@dataclass
class ThreadChoice:
    """The current decision and what it was based on (for logs, metrics, the doctor)."""

    threads: int
    others_cores: float | None = None  # busy cores of other processes, last window
    changes: int = 0


class StepThreads:
    """`threads()` before each step: the count to run it on. `ceiling`: the most (the
    threads it may use: torch's count at start); `usable`: the CPUs it may run on (its
    affinity); `fixed`: the user's
    count, kept as it is; `others_cpu_s`: cumulative CPU seconds used by other processes
    at normal priority (None where the system does not say: then the ceiling is kept)."""

    def __init__(self, ceiling: int, usable: int, fixed: int | None = None,
                 others_cpu_s: Callable[[], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S,
                 ) -> None:
        self.ceiling = max(1, ceiling)
        self.usable = max(1, usable)
        self.fixed = fixed
        self._others = others_cpu_s
        self._clock = clock
        self._window = window_s
        self.choice = ThreadChoice(fixed or self.ceiling)
        self._mark: tuple[float, float] | None = None  # (time, others' CPU s) at window start

    @property
    def adaptive(self) -> bool:
        return self.fixed is None and self._others is not None and self.ceiling > 1

    def threads(self) -> int:
        if self.adaptive:
            self._update()
        return self.choice.threads

    def _update(self) -> None:
        now = self._clock()
        if self._mark is not None and now - self._mark[0] < self._window:
            return
        assert self._others is not None
        used = self._others()
        if used is None:
            self._mark = None
            return
        if self._mark is not None:
            elapsed = now - self._mark[0]
            others = max(0.0, (used - self._mark[1]) / elapsed)
            self.choice.others_cores = others
            target = self._target(others)
            if target != self.choice.threads:
                self.choice.threads = target
                self.choice.changes += 1
        self._mark = (now, used)

    def _target(self, others: float) -> int:
        free = self.usable - others
        n = self.choice.threads
        while n > 1 and free < n - SHRINK_AT:
            n -= 1
        while n < self.ceiling and free >= n + 1 - GROW_AT:
            n += 1
        return n


def follow_free_cores(runner, fixed: int | None) -> StepThreads:
    """Set `runner` (a TorchRunner) to run each step on the threads StepThreads picks:
    `fixed` (the user's --threads) as it is, torch's count where OMP_NUM_THREADS sets it,
    else at most the count torch had when the model was loaded, fewer while other
    processes keep cores busy."""
    import torch  # a model runs: torch is loaded already

    if fixed is not None:
        torch.set_num_threads(fixed)
    elif os.environ.get("OMP_NUM_THREADS"):
        fixed = torch.get_num_threads()
    ceiling = fixed or getattr(runner, "max_threads", torch.get_num_threads())
    policy = StepThreads(ceiling, usable_cpus(), fixed, CpuShareSampler().others_seconds)
    runner.thread_count = policy.threads
    return policy
