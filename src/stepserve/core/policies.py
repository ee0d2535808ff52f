"""Scheduling policies: the order waiting requests are admitted in and the preemption
victim. A lower priority value runs first (vLLM's convention)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from stepserve.core.request import Request


class Policy:
    """Interface: `order_waiting` sorts in place (stable); `pick_victim` names the
    running request to preempt."""

    name = ""
    sorts_waiting = False  # FCFS keeps arrival order and never sorts
    tracks_tokens = False  # whether on_tokens must be called (skipped on the hot path)

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        """Sort `waiting` in place into admission order."""

    def pick_victim(self, running: list[Request], now: float) -> Request:
        raise NotImplementedError

    def on_add(self, request: Request) -> None:
        """A request entered the system."""

    def on_finish(self, request: Request) -> None:
        """A request left the system."""

    def on_tokens(self, request: Request, num_tokens: int) -> None:
        """`request` had `num_tokens` tokens computed in a step."""


class FCFS(Policy):
    """First come, first served; the victim is the most recently admitted (`running` is in
    admission order): it has the least progress to lose."""

    name = "fcfs"

    def pick_victim(self, running: list[Request], now: float) -> Request:
        return running[-1]


class RankedPolicy(Policy):
    """Admits the lowest `rank` first (ties in arrival order) and preempts the highest
    (ties: the most recently admitted). The starvation guard: with `aging_after_s` > 0, a
    request that has waited that long goes ahead of every younger one, oldest first,
    whatever its rank, so no stream of better-ranked arrivals can hold it back for ever."""

    sorts_waiting = True

    def __init__(self, aging_after_s: float = 0.0) -> None:
        self.aging_after_s = aging_after_s

    def rank(self, request: Request, now: float) -> float:
        raise NotImplementedError

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        rank, aging = self.rank, self.aging_after_s
        if aging <= 0:
            waiting.sort(key=lambda r: (rank(r, now), r.arrival_time))
            return

        def key(r: Request) -> tuple[int, float, float]:
            if now - r.arrival_time >= aging:
                return (0, 0.0, r.arrival_time)
            return (1, rank(r, now), r.arrival_time)

        waiting.sort(key=key)

    def pick_victim(self, running: list[Request], now: float) -> Request:
        rank = self.rank
        return max(running, key=lambda r: (rank(r, now), r.admitted_seq))


class PriorityWithAging(RankedPolicy):
    """Lower priority value first, then arrival; with `aging_after_s` > 0 a request
    rises a level every `aging_after_s` seconds it waits (its guard: a request k levels
    below a newcomer goes ahead of it after k intervals), so nothing starves."""

    name = "priority"

    def rank(self, request: Request, now: float) -> float:
        if self.aging_after_s <= 0:
            return request.priority
        return request.priority - int((now - request.arrival_time) // self.aging_after_s)

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        rank = self.rank  # the aging is in the rank itself
        waiting.sort(key=lambda r: (rank(r, now), r.arrival_time))


class ShortestRemaining(RankedPolicy):
    """Shortest remaining output first (estimate, else max_tokens); long ones can starve."""

    name = "srpt"

    def rank(self, request: Request, now: float) -> float:
        return request.remaining_output_estimate


class FairShare(RankedPolicy):
    """Per-tenant fair share by token counters: the smallest counter goes first, the
    largest gives up a victim; a returning tenant is lifted to the active minimum, so
    idle time earns no credit. Bounded state: an idle tenant's counter (its debt) waits
    in an LRU of `max_idle_tenants`; forgetting one loses nothing it could claim."""

    name = "fair"
    tracks_tokens = True
    DEFAULT_MAX_IDLE_TENANTS = 1024

    def __init__(self, aging_after_s: float = 0.0,
                 max_idle_tenants: int = DEFAULT_MAX_IDLE_TENANTS) -> None:
        super().__init__(aging_after_s)
        self.served: dict[str, float] = {}  # live tenants only
        self.live: dict[str, int] = {}  # live requests per live tenant
        self.idle: OrderedDict[str, float] = OrderedDict()  # most recently idle last
        self.max_idle_tenants = max_idle_tenants

    def on_add(self, request: Request) -> None:
        tenant = request.tenant
        if tenant not in self.live:
            floor = min(self.served.values(), default=0.0)
            self.served[tenant] = max(self.idle.pop(tenant, 0.0), floor)
            self.live[tenant] = 0
        self.live[tenant] += 1

    def on_finish(self, request: Request) -> None:
        tenant = request.tenant
        self.live[tenant] -= 1
        if self.live[tenant] == 0:
            del self.live[tenant]
            self.idle[tenant] = self.served.pop(tenant)
            if len(self.idle) > self.max_idle_tenants:
                self.idle.popitem(last=False)

    def on_tokens(self, request: Request, num_tokens: int) -> None:
        self.served[request.tenant] += num_tokens

    def rank(self, request: Request, now: float) -> float:
        return self.served[request.tenant]


class LongestPrefixMatch(RankedPolicy):
    """Longest cached prefix first (SGLang's lpm), ties in arrival order, with the
    starvation guard every ranked policy has; FCFS's victim."""

    name = "lpm"

    def __init__(self, cached_tokens: Callable[[Request], int],
                 aging_after_s: float = 0.0) -> None:
        super().__init__(aging_after_s)
        self.cached_tokens = cached_tokens  # the KV manager's cached prefix of a request

    def rank(self, request: Request, now: float) -> float:
        return -self.cached_tokens(request)

    def pick_victim(self, running: list[Request], now: float) -> Request:
        return running[-1]


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    FCFS, PriorityWithAging, ShortestRemaining, FairShare, LongestPrefixMatch)}


def make_policy(name: str, aging_after_s: float = 0.0,
                cached_tokens: Callable[[Request], int] | None = None) -> Policy:
    """The policy called `name` with its starvation guard (`aging_after_s`; FCFS never
    reorders, so has none); `cached_tokens(request)`: its cached prompt tokens (lpm's
    order; none given: nothing is cached)."""
    policy = POLICIES.get(name)
    if policy is None:
        raise ValueError(f"policy = {name!r}: must be one of {', '.join(POLICIES)}")
    if policy is LongestPrefixMatch:
        return LongestPrefixMatch(cached_tokens or (lambda request: 0), aging_after_s)
    if issubclass(policy, RankedPolicy):
        return policy(aging_after_s)
    return policy()
