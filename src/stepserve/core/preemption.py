"""Preemption modes: what happens to a victim's KV when a running request needs blocks
that are not there, and whether admission reserves the worst case so that never happens.
Each mode is a small class chosen by name (`preemption_mode` in SchedulerConfig).

The scheduler picks the victim (its policy), takes it out of the step and queues it by
the status `evict` returns: SWAPPED to `swapped`, PREEMPTED to the front of `waiting`.
"""

from __future__ import annotations

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, RequestStatus


class Preemption:
    """Interface. `evict` takes `victim`'s KV off the device and returns the status it
    waits in; it runs before any other bookkeeping, so a mode that refuses changes nothing."""

    name = ""
    # Admission reserves prompt + max_tokens of blocks for every request, so a running
    # request can always grow and no victim is ever needed.
    reserves_worst_case = False

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        raise NotImplementedError


def drop_kv(victim: Request, kv: KVCacheManager) -> RequestStatus:
    """Free `victim`'s blocks and start it over from zero computed tokens; its output so
    far is kept, so the recompute prefills prompt + output and resumes sampling."""
    kv.free(victim)
    victim.num_recomputed_tokens += victim.num_computed_tokens
    victim.num_computed_tokens = 0
    return RequestStatus.PREEMPTED


class Recompute(Preemption):
    """Drop the KV; recompute it when the request is admitted again."""

    name = "recompute"

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        return drop_kv(victim, kv)


class Swap(Preemption):
    """Copy the KV to the CPU pool (the copies go in `out.swap_out`); recompute when the
    pool has no room for it."""

    name = "swap"

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        pairs = kv.swap_out(victim)
        if not pairs:
            return drop_kv(victim, kv)
        out.swap_out.extend(pairs)
        victim.num_swapped_out_blocks += len(pairs)
        return RequestStatus.SWAPPED


class NoPreemption(Preemption):
    """Never evict: admission reserves each request's worst case instead (fewer requests
    run at once, none is ever interrupted)."""

    name = "none"
    reserves_worst_case = True

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        raise RuntimeError("preemption_mode=none reserves every request's blocks at "
                           "admission, yet a running request ran out of blocks")


PREEMPTIONS: dict[str, type[Preemption]] = {
    mode.name: mode for mode in (Recompute, Swap, NoPreemption)}


def make_preemption(name: str) -> Preemption:
    """The preemption mode called `name`."""
    mode = PREEMPTIONS.get(name)
    if mode is None:
        raise ValueError(f"preemption_mode = {name!r}: must be one of {', '.join(PREEMPTIONS)}")
    return mode()
