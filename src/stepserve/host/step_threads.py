"""How many CPU threads a step runs on: the cores other work leaves free.

A decode step is ~300 small products, each shared out over one OpenMP team and closed by
a barrier, so it moves only while every thread holds a core: beside one busy process on
2 cores, two threads took 29-36 ms a step (P90 120-150 ms) against one thread's 19-21 ms
and 12 ms quiet (default model, batch 1; sleeping waits 54-87 ms). A nice-19 loop from another session is worse
(with autogroups its nice value counts only in its own session): a batch-8 step went
from 46 ms to 1,248 ms. So every WINDOW_S, from cpu_share.py's readings:

* one thread fewer when others take more than SHRINK_AT of a core the team runs on
  (niced work counts until a probe showed it yields to us) or the team waits WAIT_SHRINK
  of its time on the run queue; with no fresh window (the first step, the first after
  STALE_S idle), one fewer per thread of another process runnable at that instant;
* one more onto an idle core (everyone's CPU at most GROW_AT of it); onto one niced work
  or a light neighbour holds, only if a Canary (~0.1 s hashing on a thread of its own)
  waits under WAIT_SHRINK of its time: 0.00-0.01 quiet or beside a nice-19 loop in our
  session, 0.50 beside one in another session. A shrink or a canary's no puts the next
  probe off (PROBE_FIRST_S, doubling to PROBE_MAX_S unless the count held KEPT_S).

A count the user fixed (`--threads`, OMP_NUM_THREADS) is kept as it is.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stepserve.host.cpu_share import (
    CpuReading,
    CpuShare,
    CpuShareSampler,
    read_schedstat,
    usable_cpus,
)

# A team shrinks once others take more than SHRINK_AT of the cores it runs on (one busy
# loop beside a 2-thread team gets its fair 0.67 of a core), and grows back only onto a
# core at most GROW_AT busy, so a load near the line (a benchmark client's ~0.3 cores)
# does not flip it every window.
SHRINK_AT = 0.5
GROW_AT = 0.25
# The team's run-queue wait share that says it does not get its cores: ~1% quiet, 35%
# beside a busy loop, 50% beside a nice-19 loop in another autogroup.
WAIT_SHRINK = 0.2
WINDOW_S = 0.5  # how long a reading's window is before a decision
PROBE_FIRST_S = 2.0  # the wait before the first probe after a shrink
PROBE_MAX_S = 60.0
KEPT_S = 5.0  # a count held this long was right: the next shrink starts the backoff over
STALE_S = 2.0  # a window longer than this (an idle spell) says nothing of the present
NICE_GONE = 0.1  # niced work under this many cores: none to speak of
CANARY_S = 0.1  # how long a canary works
SCHEDSTAT = "/proc/thread-self/schedstat"
_BUFFER = bytes(1 << 18)  # hashed in a loop: sha256 lets go of the GIL for big inputs


@dataclass
class ThreadChoice:
    """The current decision and what it was based on (for logs, metrics, the doctor)."""

    threads: int
    others_cores: float | None = None  # other processes at normal priority, last window
    wait_share: float | None = None  # the team's run-queue wait share, last window
    changes: int = 0


class StepThreads:
    """`threads()` before each step: the count to run it on, at most `ceiling` (torch's
    count at start) on `usable` CPUs; `fixed` (the user's) is kept; without `read`
    (CpuShareSampler.read) the ceiling is; without a `canary` an extra thread is tried."""

    def __init__(self, ceiling: int, usable: int, fixed: int | None = None,
                 read: Callable[[], CpuReading] | None = None,
                 clock: Callable[[], float] = time.monotonic, canary: Canary | None = None,
                 glance: Callable[[], int | None] | None = None) -> None:
        self.ceiling = max(1, ceiling)
        self.usable = max(1, usable)
        self.fixed = fixed
        self._read = read
        self._clock = clock
        self.choice = ThreadChoice(fixed or self.ceiling)
        self._mark: tuple[float, CpuReading] | None = None  # the window's start
        self._probe_wait = PROBE_FIRST_S
        self._next_probe = clock() + PROBE_FIRST_S
        self._changed_at = clock() - KEPT_S  # when the count last changed (the first
        # count counts as held)
        self._canary = canary
        self._glance = glance
        self._nice_yields = False  # a probe showed that the niced work gives way to us

    @property
    def adaptive(self) -> bool:
        return self.fixed is None and self._read is not None and self.ceiling > 1

    def threads(self) -> int:
        if self.adaptive:
            self._update()
        return self.choice.threads

    def _update(self) -> None:
        now = self._clock()
        if self._mark is not None and now - self._mark[0] < WINDOW_S:
            return
        assert self._read is not None
        reading = self._read()
        stale = self._mark is None or now - self._mark[0] > STALE_S
        if stale and self._glance is not None:
            self._first_look(now)
        elif self._mark is not None and reading.available:
            share = CpuShare.between(self._mark[1], reading)
            self.choice.others_cores = share.others_cores
            self.choice.wait_share = share.wait_share
            target = self._target(share, now)
            if target < self.choice.threads:
                crowded = self.usable - (share.others_cores or 0.0) < target + SHRINK_AT
                self._put_off_probes(now, crowded)
            if target != self.choice.threads:
                self._change(target, now)
        self._mark = (now, reading)

    def _first_look(self, now: float) -> None:
        """No window to judge by (a window across an idle spell averages the idle time):
        each thread of others runnable now takes a core from the team at once, since a
        step on a held core can take 10x its time (a 256-token prefill, 2 threads beside
        a busy loop: 10 s against 0.7 s on one); a core found idle comes back later."""
        others = self._glance()
        if others is None:
            return
        target = max(1, min(self.choice.threads, self.usable - others))
        if target < self.choice.threads:
            self._put_off_probes(now, crowded=True)
            self._change(target, now)

    def _change(self, target: int, now: float) -> None:
        self.choice.threads = target
        self.choice.changes += 1
        self._changed_at = now

    def _target(self, share: CpuShare, now: float) -> int:
        n = self.choice.threads
        others, nice = share.others_cores or 0.0, share.nice_cores or 0.0
        waited = share.wait_share is not None and share.wait_share >= WAIT_SHRINK
        if waited or nice < NICE_GONE:
            self._nice_yields = False
        crowd = others + (0.0 if self._nice_yields else nice)
        if n > 1 and (waited or self.usable - crowd < n - SHRINK_AT):
            return n - 1
        if n >= self.ceiling or waited:
            return n
        if self.usable - others - nice >= n + 1 - GROW_AT:
            return n + 1  # an idle core
        if self.usable - others < n + 1 - SHRINK_AT:
            return n  # work at normal priority holds it: nothing to ask
        if self._probe(now):
            self._nice_yields = nice >= NICE_GONE  # kept while the team gets its cores
            return n + 1
        return n

    def _probe(self, now: float) -> bool:
        """Whether to take one more thread now: the canary's answer once it has one (no
        puts the next question off), else start it when one is due."""
        if self._canary is None:
            return now >= self._next_probe  # the next window says whether it stays
        finished, share = self._canary.take()
        if finished:
            if share is None or share < WAIT_SHRINK:
                return True  # a thread of ours got the core (or no one can say: try it)
            self._back_off(now)
        elif now >= self._next_probe and not self._canary.running:
            self._canary.start()
        return False

    def _put_off_probes(self, now: float, crowded: bool) -> None:
        """A shrink. After a count that held KEPT_S, the next probe comes a window on
        where others took the core (`crowded`: a burst), else after PROBE_FIRST_S (the
        team waited: nothing says when that ends); after a shorter hold, _back_off."""
        if now - self._changed_at >= KEPT_S:
            self._probe_wait = WINDOW_S if crowded else PROBE_FIRST_S
            self._next_probe = now + self._probe_wait
        else:
            self._back_off(now)

    def _back_off(self, now: float) -> None:
        """The next probe waits twice as long (within PROBE_FIRST_S..PROBE_MAX_S)."""
        self._probe_wait = min(max(2 * self._probe_wait, PROBE_FIRST_S), PROBE_MAX_S)
        self._next_probe = now + self._probe_wait


def canary_wait_share(seconds: float = CANARY_S, path: str = SCHEDSTAT) -> float | None:
    """This thread's run-queue wait share over `seconds` of busy work; None where the
    kernel does not say (no schedstat)."""
    if (before := read_schedstat(path)) is None:
        return None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(_BUFFER)
    if (after := read_schedstat(path)) is None:
        return None
    (on0, wait0), (on1, wait1) = before, after
    total = (on1 - on0) + (wait1 - wait0)
    return (wait1 - wait0) / total if total > 0 else None


def _daemon(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="stepserve-canary", daemon=True).start()


class Canary:
    """Would one more thread of ours get a core? One canary at a time: `start()` runs
    `measure` on a thread of its own (`spawn`); `take()` hands back (finished, wait
    share) once, then forgets it."""

    def __init__(self, measure: Callable[[], float | None] = canary_wait_share,
                 spawn: Callable[[Callable[[], None]], None] = _daemon) -> None:
        self._measure, self._spawn = measure, spawn
        self._lock = threading.Lock()
        self.running = False
        self._result: tuple[float | None] | None = None  # a finished run's share

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            self.running, self._result = True, None
        self._spawn(self._run)

    def _run(self) -> None:
        try:
            share = self._measure()
        except Exception:  # noqa: BLE001 - a canary that fails says nothing
            share = None
        with self._lock:
            self._result, self.running = (share,), False

    def take(self) -> tuple[bool, float | None]:
        with self._lock:
            if self._result is None:
                return False, None
            (share,), self._result = self._result, None
            return True, share


def follow_free_cores(runner, fixed: int | None) -> StepThreads:
    """Set `runner` (a TorchRunner) to run each step on the threads StepThreads picks:
    `fixed` (the user's --threads) as it is, torch's count where OMP_NUM_THREADS sets it,
    else at most the count torch had when the model was loaded, fewer while other work
    keeps cores busy."""
    import torch  # a model runs: torch is loaded already

    if fixed is None and os.environ.get("OMP_NUM_THREADS"):
        fixed = torch.get_num_threads()
    ceiling = fixed or getattr(runner, "max_threads", torch.get_num_threads())
    sampler = CpuShareSampler()
    policy = StepThreads(ceiling, usable_cpus(), fixed, sampler.read, canary=Canary(),
                         glance=sampler.running_others)
    runner.thread_count = policy.threads
    return policy
