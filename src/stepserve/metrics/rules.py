"""The incidents' alert rules, each a small check over a RunSummary that declares the
fields it needs (rule.py) and reads them as attributes. Each returns one Finding or None;
the settings only sharpen the advice, e.g. name the chunk cap actually set.

Thresholds come from the incidents' post-mortems (night-report, mixed-pool, promo-spike:
docs/guide.md tells each story) and the tail-latency table; where a rule's early signal
leads a later alert, the lead is measured on the run's own series (alert_times.py).
`RULES` also holds the rules of rules_batching.py, stall_rule.py, rules_outcomes.py,
rules_experience.py and rules_cache.py.
"""

from __future__ import annotations

from stepserve.metrics.alert_times import (
    PREFILL_STEP_SHARE_MAX,
    QUEUE_ALERT,
    STEP_WINDOW,
    TTFT_P99_ALERT_S,
    ZERO_DECODE_STEP_SHARE_MAX,
    lead,
)
from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import Rule, RuleSettings, S, pct, rule
from stepserve.metrics.rules_batching import low_active_ratio, low_slot_utilization
from stepserve.metrics.rules_cache import prefix_cache_thrash
from stepserve.metrics.rules_experience import throughput_over_experience, tpot_tail
from stepserve.metrics.rules_outcomes import rejections, timeouts
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.stall_rule import prefill_stalls_decode

CAPACITY_TAIL_RATIO = 10.0  # promo-spike: P99/P50 over this with preemptions > 0
QUEUE_CLIMB_MIN_STEPS = 10  # a climb over fewer steps is a burst of arrivals, not a trend
KV_FULL = 0.95  # KV usage at which running is limited by blocks rather than slots
WAITING_MOST_OF_RUN = 0.50  # a queue in more than half the samples
TTFT_TAIL_RATIO = 5.0  # "mean TTFT normal, P99 high"
TPOT_NORMAL_STEPS = 1.5  # TPOT P50 within this many mean steps is "normal"
PREFILL_TOKEN_SHARE_MIN = 0.5  # prefill fills the steps: most computed tokens are prefill
_TTFT_LATE = ("TTFT P99", f"passed {TTFT_P99_ALERT_S:g} s")


@rule((S.prefill_step_share, S.zero_decode_step_share))
def chunk_cap_eats_budget(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    prefill, zero = s.prefill_step_share, s.zero_decode_step_share
    hot_prefill = prefill is not None and prefill > PREFILL_STEP_SHARE_MAX
    hot_zero = zero is not None and zero > ZERO_DECODE_STEP_SHARE_MAX
    if not (hot_prefill or hot_zero):
        return None
    seen = []
    if prefill is not None:
        seen.append(f"{pct(prefill)} of steps were prefill-only (alert over "
                    f"{PREFILL_STEP_SHARE_MAX:.0%})")
    if zero is not None:
        seen.append(f"{pct(zero)} of steps gave decode-ready sequences no token (alert over "
                    f"{ZERO_DECODE_STEP_SHARE_MAX:.0%})")
    budget, threshold = cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold
    if budget is not None and threshold is not None:
        cap = threshold if threshold > 0 else budget
        named = (f"the chunk cap is long_prefill_token_threshold = {threshold}"
                 f"{' (0: the whole budget)' if threshold == 0 else ''}, i.e. {cap} of "
                 f"max_num_batched_tokens = {budget}")
        example = (f"e.g. {max(budget // 4, 1)} of {budget}; the mixed-pool incident was "
                   "fixed with a chunk cap of 2048 of 8192")
    else:
        named = "the chunk cap (long_prefill_token_threshold) leaves decode no budget"
        example = "e.g. 2048 of 8192"
    order_note = " (now prefill_first)" if cfg.budget_order == "prefill_first" else ""
    measured = lead(s, S.alert_prefill_share_at_s,
                    (f"the last {STEP_WINDOW} steps", f"passed {PREFILL_STEP_SHARE_MAX:.0%} "
                     f"prefill-only or {ZERO_DECODE_STEP_SHARE_MAX:.0%} zero-decode"),
                    S.alert_ttft_p99_at_s, _TTFT_LATE,
                    "the mixed-pool incident reported this alert about 40 minutes ahead of "
                    "its TTFT alert")
    return Finding(
        "chunk_cap_eats_budget", "critical",
        "; ".join(seen) + f": the prefill chunk cap eats the step budget; {measured}",
        f"{named}; set long_prefill_token_threshold below max_num_batched_tokens ({example}) "
        f"so the difference is decode's budget, max_num_partial_prefills 1, budget_order "
        f"decode_first{order_note}")


@rule((S.preemptions,), (S.p99_p50_e2e_ratio, S.p99_p50_ttft_ratio))
def capacity(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    pre = s.preemptions
    ratios = {"e2e": s.p99_p50_e2e_ratio, "ttft": s.p99_p50_ttft_ratio}
    worst = max((r for r in ratios.values() if r is not None), default=None)
    if not pre or worst is None or worst <= CAPACITY_TAIL_RATIO:
        return None
    shown = ", ".join(f"{name.upper()} {r:.1f}" for name, r in ratios.items() if r is not None)
    seqs = cfg.max_num_seqs
    lower = f"lower max_num_seqs (now {seqs})" if seqs is not None else "lower max_num_seqs"
    return Finding(
        "capacity", "critical",
        f"P99/P50 {shown} (alert over {CAPACITY_TAIL_RATIO:g}) with {int(pre)} preemptions: "
        "a capacity problem",
        f"add replicas first, then {lower} to what KV holds at the maximum length, not the "
        "mean (`stepserve plan capacity`), and cap max_waiting so excess load fails fast; "
        "do not start by tweaking the batch size")


@rule((S.preemptions,))
def preemption_nonzero(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    pre = s.preemptions
    if not pre:
        return None
    parts = [f"{int(pre)} preemptions"]
    if s.preempted_requests is not None:
        parts[0] += f" on {int(s.preempted_requests)} requests"
    if s.swapped_blocks is not None:
        parts.append(f"{int(s.swapped_blocks)} KV blocks swapped out")
    if s.recomputed_tokens is not None:
        parts.append(f"{int(s.recomputed_tokens)} tokens recomputed")
    if s.preemptions_on_long_share is not None:
        threshold = s.long_request_threshold if s.long_request_threshold is not None else "?"
        parts.append(f"{pct(s.preemptions_on_long_share)} of preemptions hit requests with "
                     f"over {threshold} output tokens")
    return Finding(
        "preemption_nonzero", "warning", ", ".join(parts),
        "sustained preemption means KV capacity is short: lower max_num_seqs to what KV "
        "holds at the maximum length, add KV memory or replicas, or split long requests "
        "into their own pool; keep preemptions, swapped blocks and recomputed tokens on a "
        "dashboard")


@rule((S.waiting_growth,))
def queue_growing(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    growth = s.waiting_growth
    if growth is None or growth <= 0:
        return None
    climb = s.waiting_monotonic_rise or 0
    climb_s = s.waiting_monotonic_rise_s or 0
    trend = s.waiting_trend_rise or 0
    peak = s.waiting_max or 0
    running = s.running_max or 0
    step = s.mean_step_s
    long_climb = climb_s >= QUEUE_CLIMB_MIN_STEPS * step if step else climb_s > 0
    sustained = trend >= QUEUE_ALERT or (climb >= QUEUE_ALERT and long_climb)
    large = trend >= 1 and peak >= max(QUEUE_ALERT, running)
    if not (sustained or large):
        return None
    measured = lead(s, S.alert_queue_at_s, ("the waiting queue", f"reached {QUEUE_ALERT}"),
                    S.alert_ttft_p99_at_s, _TTFT_LATE,
                    "the promo-spike incident reported its queue about 20 minutes ahead of "
                    "its P99 alert")
    return Finding(
        "queue_growing", "warning",
        f"the waiting queue grew by {growth:.2f} requests/s while requests arrived (fitted "
        f"rise {trend:.1f}); longest climb without a dip: +{climb:g} in {climb_s:.3g} s; "
        f"peak {peak:g} waiting vs {running:g} running; {measured}",
        f"alert on the waiting queue length (num_requests_waiting) reaching {QUEUE_ALERT}: "
        "it is the earliest signal, ahead of a P99 alert; fail fast with "
        "queue.max_queue_time_s and queue.max_waiting, and add capacity (replicas)")


def _capacity_limit(s: RunSummary, cfg: RuleSettings, running: float) -> str | None:
    """Why running stayed where it did (slots or KV), or None when neither ran out."""
    seqs, replicas = cfg.max_num_seqs, cfg.replicas or 1
    if seqs is None:
        return f"running peaked at {running:g}"
    kv, preempted = s.kv_usage_max, s.preemptions
    if running >= seqs * replicas:
        return f"running peaked at {running:g} = max_num_seqs {seqs} x {replicas} replica(s)"
    if preempted or (kv is not None and kv >= KV_FULL):
        kv_text = f", KV usage peaked at {pct(kv)}" if kv is not None else ""
        return (f"running peaked at {running:g}, below max_num_seqs {seqs} x {replicas} "
                f"replica(s): KV blocks were the limit ({int(preempted or 0)} "
                f"preemptions{kv_text})")
    return None  # neither slots nor KV ran out: the step budget held requests back


@rule((S.waiting_nonzero_share,), (S.waiting_p50,), (S.running_max,))
def running_below_offered(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    queued, running, median = s.waiting_nonzero_share, s.running_max, s.waiting_p50
    if queued is None or running is None or queued <= WAITING_MOST_OF_RUN or not median:
        return None
    offered = s.in_engine_max
    if offered is not None and offered <= running:
        return None  # never more in the engine than once ran: idle slots (static), not capacity
    why = _capacity_limit(s, cfg, running)
    if why is None:
        return None
    offered_text = f"; up to {offered:g} requests were in the engine" if offered else ""
    return Finding(
        "running_below_offered", "warning",
        f"requests queued in {pct(queued)} of the samples (median {median:g}, "
        f"peak {s.waiting_max}); {why}{offered_text}: running capacity is below the "
        "offered concurrency",
        "size replicas by peak concurrency over what one replica holds (`stepserve plan "
        "capacity --peak-concurrency N`), and cap max_waiting so the excess gets a 429 "
        "instead of a long queue")


@rule((S.p99_p50_ttft_ratio,), (S.tpot_p50_s,), (S.mean_step_s,), (S.prefill_token_share,))
def tail_ttft_from_prefill(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    r, tpot, step = s.p99_p50_ttft_ratio, s.tpot_p50_s, s.mean_step_s
    prefill = s.prefill_token_share
    if r is None or r < TTFT_TAIL_RATIO or tpot is None or not step or prefill is None:
        return None
    if tpot > TPOT_NORMAL_STEPS * step:
        return None  # decode is slow too: queueing or saturation, not prefill alone
    if prefill < PREFILL_TOKEN_SHARE_MIN:
        return None  # short prompts cannot squeeze the budget; the tail is queueing
    if running_below_offered(s, cfg) is not None:
        return None  # requests queued for slots or KV: that rule explains the tail
    p99, p50 = s.ttft_p99_s, s.ttft_p50_s
    both = f" (P99 {p99:.3f} s, P50 {p50:.3f} s)" if p99 is not None and p50 is not None else ""
    seen = (f"TTFT P99/P50 = {r:.1f}{both} while TPOT P50 = {tpot:.4f} s stays within "
            f"{TPOT_NORMAL_STEPS:g}x of the mean step ({step:.4f} s) and prefill is "
            f"{pct(prefill)} of the computed tokens")
    budget, cap = cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold
    if budget is not None and cap is not None and 0 < cap < budget \
            and cfg.budget_order == "decode_first":
        # The remedy this row names is in place: a long prompt takes one chunk of each
        # step and the rest is left to others, so the tail is the long prompts' own
        # prefill over several steps, the trade the mixed-pool incident's fix accepted.
        return Finding(
            "tail_ttft_from_prefill", "info",
            f"{seen}; the chunk cap is already below the budget ({cap} of {budget}, decode "
            "first), so the tail is long prompts taking several chunk steps each, not a "
            "squeeze",
            "if the long prompts' TTFT matters, route them to their own pool (`--pools`) or "
            "cap request length; compare TTFT by request class")
    return Finding(
        "tail_ttft_from_prefill", "warning",
        f"{seen}: long prompt prefill is squeezing the budget",
        "chunk long prompts: long_prefill_token_threshold below max_num_batched_tokens, "
        "max_num_partial_prefills 1, budget_order decode_first; cap request length or route "
        "long prompts to their own pool")


# Findings are listed most severe first, in this order within a severity.
RULES: tuple[Rule, ...] = (
    capacity, chunk_cap_eats_budget, queue_growing, running_below_offered,
    preemption_nonzero, prefill_stalls_decode, tail_ttft_from_prefill,
    low_slot_utilization, low_active_ratio, prefix_cache_thrash, rejections, timeouts,
    tpot_tail, throughput_over_experience,
)
