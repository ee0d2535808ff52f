"""Clocks. Core code never calls time.time(): it asks a clock, so the same scheduler
runs on wall time (real engine) and on virtual time (simulator)."""

from __future__ import annotations

import time


class Clock:
    """Interface: `now()` in seconds. Virtual clocks also `advance()`."""

    def now(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class WallClock(Clock):
    """Monotonic wall time, for the real engine and the server."""

    def now(self) -> float:
        return time.monotonic()


class VirtualClock(Clock):
    """Simulated time: moves only when the simulator says a step took `dt` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"clock cannot go backwards (dt={dt})")
        self._now += dt

    def advance_to(self, t: float) -> None:
        if t > self._now:
            self._now = t
