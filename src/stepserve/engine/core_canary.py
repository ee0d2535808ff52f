"""Would one more thread of ours get a core? Asked by a canary, not by the team.

Trying the team's extra thread for a step answers the question at the team's expense:
beside a nice-19 loop started from another session (which, with the kernel's autogroups,
takes a whole core's share), a batch-8 step on two threads took 1,248 ms instead of
71 ms on one, because every barrier waits for the thread the scheduler keeps off its
core. A canary asks the same question for ~0.1 s of one thread: a loop of GIL-free work
(hashing a buffer) on a thread of its own while the engine steps on, then the run-queue
wait share of that thread (/proc/thread-self/schedstat). Measured on 2 cores with a
second thread of the same process busy: 0.00-0.01 on a quiet machine and beside a
nice-19 loop in the same session (it yields), 0.50 beside a nice-19 loop in another
session and beside a busy loop at normal priority (it does not).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from stepserve.engine.cpu_share import read_schedstat

CANARY_S = 0.1
SCHEDSTAT = "/proc/thread-self/schedstat"
_BUFFER = bytes(1 << 18)  # hashed in a loop: sha256 lets go of the GIL for big inputs


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
    """One canary at a time: `start()` runs `measure` on a thread of its own (`spawn`);
    `take()` hands back (finished, wait share) once, then forgets it."""

    def __init__(self, measure: Callable[[], float | None] = canary_wait_share,
                 spawn: Callable[[Callable[[], None]], None] = _daemon) -> None:
        self._measure, self._spawn = measure, spawn
        self._lock = threading.Lock()
        self._running = False
        self._result: tuple[float | None] | None = None  # a finished run's share

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._running, self._result = True, None
        self._spawn(self._run)

    def _run(self) -> None:
        try:
            share = self._measure()
        except Exception:  # noqa: BLE001 - a canary that fails says nothing
            share = None
        with self._lock:
            self._result, self._running = (share,), False

    def take(self) -> tuple[bool, float | None]:
        with self._lock:
            if self._result is None:
                return False, None
            (share,), self._result = self._result, None
            return True, share
