"""Scheduling policies: the order in which waiting requests are admitted and which
running request is the preemption victim. Each is a small class chosen by name.

Convention (vLLM's): a lower priority value runs first.
"""

from __future__ import annotations

from collections import defaultdict

from stepserve.request import Request


class Policy:
    """Interface. `order_waiting` sorts the queue in place (stable); `pick_victim`
    returns the running request to preempt when blocks run out."""

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
    """First come, first served. The victim is the most recently admitted running
    request: it has the least progress to lose. `running` is kept in admission order."""

    name = "fcfs"

    def pick_victim(self, running: list[Request], now: float) -> Request:
        return running[-1]


class PriorityWithAging(Policy):
    """Lower priority value first, then arrival. With `aging_after_s` > 0 a request
    rises one level for every `aging_after_s` seconds since it arrived, so a low
    priority request waits at most about (its level - the best level) x aging_after_s
    longer than an urgent one: nothing starves."""

    name = "priority"
    sorts_waiting = True

    def __init__(self, aging_after_s: float = 0.0) -> None:
        self.aging_after_s = aging_after_s

    def effective_priority(self, request: Request, now: float) -> float:
        if self.aging_after_s <= 0:
            return request.priority
        return request.priority - int((now - request.arrival_time) // self.aging_after_s)

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        eff = self.effective_priority
        waiting.sort(key=lambda r: (eff(r, now), r.arrival_time))

    def pick_victim(self, running: list[Request], now: float) -> Request:
        eff = self.effective_priority
        return max(running, key=lambda r: (eff(r, now), r.admitted_seq))


class ShortestRemaining(Policy):
    """Shortest remaining output first (from the length estimate, else max_tokens).
    Minimises mean completion time; long requests can starve, as the seed warns."""

    name = "srpt"
    sorts_waiting = True

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        waiting.sort(key=lambda r: (r.remaining_output_estimate, r.arrival_time))

    def pick_victim(self, running: list[Request], now: float) -> Request:
        return max(running, key=lambda r: (r.remaining_output_estimate, r.admitted_seq))


class FairShare(Policy):
    """Per-tenant fair share by virtual token counters: each tenant's counter grows by
    the tokens computed for it; the tenant with the smallest counter goes first and the
    one with the largest gives up a victim. A tenant that becomes active again is lifted
    to the smallest counter among active tenants, so idle time earns no credit."""

    name = "fair"
    sorts_waiting = True
    tracks_tokens = True

    def __init__(self) -> None:
        self.served: dict[str, float] = defaultdict(float)
        self.live: dict[str, int] = defaultdict(int)

    def on_add(self, request: Request) -> None:
        tenant = request.tenant
        if self.live[tenant] == 0:
            active = [self.served[t] for t, n in self.live.items() if n > 0]
            if active:
                self.served[tenant] = max(self.served[tenant], min(active))
        self.live[tenant] += 1

    def on_finish(self, request: Request) -> None:
        self.live[request.tenant] -= 1

    def on_tokens(self, request: Request, num_tokens: int) -> None:
        self.served[request.tenant] += num_tokens

    def order_waiting(self, waiting: list[Request], now: float) -> None:
        served = self.served
        waiting.sort(key=lambda r: (served[r.tenant], r.arrival_time))

    def pick_victim(self, running: list[Request], now: float) -> Request:
        served = self.served
        return max(running, key=lambda r: (served[r.tenant], r.admitted_seq))


def make_policy(name: str, aging_after_s: float = 0.0) -> Policy:
    if name == "fcfs":
        return FCFS()
    if name == "priority":
        return PriorityWithAging(aging_after_s)
    if name == "srpt":
        return ShortestRemaining()
    if name == "fair":
        return FairShare()
    raise ValueError(f"policy = {name!r}: must be one of fcfs, priority, srpt, fair")
