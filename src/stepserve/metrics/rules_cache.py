"""The prefix cache's rule: a cache that thrashes. The workload repeats much of its
prompts (the share of prompt tokens an earlier prompt began with: what a cache that never
evicted could give), yet the cache gave far less: blocks were evicted before the
requests that wanted them came, or the requests went where the blocks were not.

Lines: a repeated share under 20% leaves too little to win for a miss to matter (a few
shared system prompts in a mostly distinct workload); a hit rate under half the repeated
share means the cache kept less than half of what was there to keep. Cold misses are
already out of the repeated share (a prefix's first request counts nothing), so a
healthy cache sits near it, less only the blocks a shorter block grain splits.
"""

from __future__ import annotations

from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import RuleSettings, S, pct, rule
from stepserve.metrics.run_summary import RunSummary

REPEATED_SHARE_MIN = 0.20  # below this the workload has little to share
HIT_OF_REPEATED_MIN = 0.50  # the hit rate as a fraction of the repeated share


@rule((S.prefix_cache_hit_rate,), (S.prefix_repeated_share,))
def prefix_cache_thrash(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    hit, repeated = s.prefix_cache_hit_rate, s.prefix_repeated_share
    if hit is None or repeated is None or repeated < REPEATED_SHARE_MIN:
        return None
    if hit >= HIT_OF_REPEATED_MIN * repeated:
        return None
    kept = hit / repeated
    kv = f"; KV usage peaked at {pct(s.kv_usage_max)}" if s.kv_usage_max is not None else ""
    routed = ""
    if cfg.replicas is not None and cfg.replicas > 1:
        routed = f" over {cfg.replicas} replicas"
    return Finding(
        "prefix_cache_thrash", "warning",
        f"{pct(repeated)} of the prompt tokens repeat an earlier prompt's prefix, but the "
        f"prefix cache gave only {pct(hit)} ({pct(kept)} of what was there to share)"
        f"{routed}{kv}: cached blocks are evicted before the requests that want them come, "
        "or those requests land where their prefix is not",
        "raise the KV pool (--num-gpu-blocks-override, or more KV memory per replica) so a "
        "prefix outlives the gap between its requests; with replicas, route by prefix "
        "(router prefix_affinity) so a prefix's requests meet its blocks; use "
        "--scheduling-policy lpm so waiting requests whose prefix is cached run before it "
        "is evicted; and check that prefix caching is on (--enable-prefix-caching)")
