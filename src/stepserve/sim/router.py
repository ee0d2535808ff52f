"""Routers: which replica gets a new request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _HasOutstanding(Protocol):
    @property
    def outstanding(self) -> int: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, replicas: Sequence[_HasOutstanding]) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class LeastOutstanding:
    """The replica with the fewest live requests (ties: lowest index)."""

    name = "least_outstanding"

    def pick(self, replicas: Sequence[_HasOutstanding]) -> int:
        best = 0
        for i in range(1, len(replicas)):
            if replicas[i].outstanding < replicas[best].outstanding:
                best = i
        return best


def make_router(name: str) -> RoundRobin | LeastOutstanding:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_outstanding":
        return LeastOutstanding()
    raise ValueError(f"router = {name!r}: must be one of round_robin, least_outstanding")
