"""Admission from the prefix cache, shared by every batching mode: a request admitted
with the blocks `KVCacheManager.cached_prefix` found (handed to `allocate_slots`) starts
past them. Continuous, static and dynamic batching all admit through `take_prefix_hit`,
so the baselines are compared with continuous batching on the same cache and counters."""

from __future__ import annotations

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.request import Request


def take_prefix_hit(kv: KVCacheManager, req: Request, hit_tokens: int) -> None:
    """`req` was admitted holding `hit_tokens` tokens from the prefix cache."""
    req.num_computed_tokens += hit_tokens
    req.prefix_hit_tokens = hit_tokens
    if req.first_scheduled_time is None:  # its prompt's first admission: for usage
        req.num_cached_tokens = hit_tokens
        # the metrics count first admissions only (vLLM's counters leave preempted
        # requests out), so they move by exactly what usage reports
        if kv.looks_up(req):
            kv.prefix_cache_queries += req.num_tokens
            kv.prefix_cache_hits += hit_tokens
