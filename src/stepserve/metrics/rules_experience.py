"""Rules from the tail-latency table's second and fourth rows: a TPOT tail while the
typical stream's pace is normal (preemption, batch swings, memory pressure: lower
concurrency, keep headroom, split pools), and high throughput with a poor experience
(a batch too large: limit the batch, tune by the SLA).
"""

from __future__ import annotations

from stepserve.metrics.alert_times import TTFT_P99_ALERT_S
from stepserve.metrics.finding import Finding
from stepserve.metrics.percentiles import ratio
from stepserve.metrics.rule import RuleSettings, S, pct, rule
from stepserve.metrics.run_summary import RunSummary

# TPOT P99 over 5x its P50, the line the TTFT row of the table is held to
# (tail_ttft_from_prefill): the slowest streams get a token a fifth as often as the
# typical one. Simulated incident configurations run at 1.0-3.1 (a mixed pool's chunk
# steps slow the streams that share them); the mixed-pool incident's spike was 6.8 s
# over a 58 ms median, over 100x.
TPOT_TAIL_RATIO = 5.0
TPOT_MEAN_NORMAL = 1.5  # a mean within 1.5x the median: the typical stream is fine
STEP_SWING_RATIO = 3.0  # step time P99 over 3x its P50: the batch's make-up swings
KV_NEAR_FULL = 0.95  # KV usage at which blocks, not slots, limit the batch
# Fewer than 9 in 10 completed requests meeting the SLO is an SLO missed (goodput is
# counted against the SLO a bench run was given); fewer than half is critical.
GOODPUT_SHARE_MIN = 0.90
GOODPUT_SHARE_CRITICAL = 0.50
# Without an SLO: a full batch (running at 90% of max_num_seqs x replicas, every held
# slot producing) and no queue, yet the TTFT P99 past the promo-spike incident's P99
# alert (5 s) and over 50 steps: a first token should take the few steps of its prefill
# once admitted, so the batch is sharing the steps too thinly. A batch that never filled
# its slots is not "too large" (the tail is then the prompts' own; tail_ttft_from_prefill).
# E2E is no such yardstick: a 2,000-token answer takes 2,000 steps by design.
BUSY_SLOT_UTILIZATION = 0.90
FULL_BATCH = 0.90
FAR_STEPS = 50
QUEUED_SHARE_OF_TTFT = 0.5  # queue time P99 at half the TTFT P99: the wait is the queue


@rule((S.tpot_p99_s, S.p99_p50_tpot_ratio), (S.tpot_p50_s, S.p99_p50_tpot_ratio))
def tpot_tail(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    p99, p50, mean = s.tpot_p99_s, s.tpot_p50_s, s.tpot_mean_s
    r = ratio(p99, p50) if p99 is not None and p50 is not None else s.p99_p50_tpot_ratio
    if r is None or r < TPOT_TAIL_RATIO:
        return None
    if mean is not None and p50 and mean > TPOT_MEAN_NORMAL * p50:
        return None  # the typical stream is slow too: queueing or saturation, not a tail
    shown = f" (P99 {p99:.3g} s, P50 {p50:.3g} s" if p99 is not None and p50 is not None \
        else " ("
    shown += f", mean {mean:.3g} s)" if mean is not None else ")"
    causes, fixes = [], []
    seqs = f" from {cfg.max_num_seqs}" if cfg.max_num_seqs is not None else ""
    if s.preemptions:
        causes.append(f"{int(s.preemptions)} preemptions (a preempted stream waits to be "
                      "recomputed or swapped back in)")
    if s.kv_usage_max is not None and s.kv_usage_max >= KV_NEAR_FULL:
        causes.append(f"KV usage peaked at {pct(s.kv_usage_max)} (memory pressure)")
    if causes:
        fixes.append(f"lower concurrency (max_num_seqs{seqs}) to what KV holds with headroom "
                     "(`stepserve plan capacity` keeps 15%)")
    swing = ratio(s.step_p99_s, s.step_p50_s)
    if swing is not None and swing >= STEP_SWING_RATIO:
        causes.append(f"step time swings: P99 {s.step_p99_s:.3g} s vs P50 "
                      f"{s.step_p50_s:.3g} s ({swing:.1f}x, the batch's make-up changes "
                      "from step to step)")
        fixes.append("bound what prefill takes of a step (long_prefill_token_threshold below "
                     "max_num_batched_tokens, budget_order decode_first)")
    fixes.append("split online and offline traffic into their own pools (`--pools`)")
    why = "; likely causes in this run: " + "; ".join(causes) if causes else \
        ("; none of preemption, step-time swings or KV pressure shows in this run: compare "
         "TPOT by request class")
    return Finding(
        "tpot_tail", "warning",
        f"TPOT P99/P50 = {r:.1f}{shown}: the slowest streams' pace is over "
        f"{TPOT_TAIL_RATIO:g}x the typical one's while the mean stays normal{why}",
        "; ".join(fixes))


def _batch_text(s: RunSummary, cfg: RuleSettings) -> str:
    parts = []
    if s.slot_utilization is not None:
        parts.append(f"slot utilisation {pct(s.slot_utilization)}")
    if s.running_max is not None:
        cap = f" of max_num_seqs {cfg.max_num_seqs}" if cfg.max_num_seqs is not None else ""
        parts.append(f"running peaked at {s.running_max:g}{cap}")
    return "; " + ", ".join(parts) if parts else ""


def _batch_full(s: RunSummary, cfg: RuleSettings) -> bool | None:
    """Whether running reached its slot cap (max_num_seqs x replicas); None if unknown."""
    if s.running_max is None or cfg.max_num_seqs is None:
        return None
    return s.running_max >= FULL_BATCH * cfg.max_num_seqs * (cfg.replicas or 1)


def _queued(s: RunSummary) -> str | None:
    """What says requests waited for a slot (the queue rules' case), or None."""
    if s.waiting_p50:
        return f"requests queued (median {s.waiting_p50:g} waiting)"
    wait, ttft = s.queue_time_p99_s, s.ttft_p99_s
    if wait is not None and ttft and wait >= QUEUED_SHARE_OF_TTFT * ttft:
        return f"requests queued (queue time P99 {wait:.3g} s of a TTFT P99 of {ttft:.3g} s)"
    return None


def _limit_batch(s: RunSummary, cfg: RuleSettings, slo: str) -> str:
    budget = f" (now {cfg.max_num_batched_tokens})" \
        if cfg.max_num_batched_tokens is not None else ""
    if _batch_full(s, cfg) is False:
        what, knob = (f"the step budget: lower max_num_batched_tokens{budget} (running never "
                      f"filled max_num_seqs {cfg.max_num_seqs}, so lowering that changes "
                      "nothing)", "max_num_batched_tokens")
    else:
        seqs = f" (now {cfg.max_num_seqs})" if cfg.max_num_seqs is not None else ""
        what, knob = (f"lower max_num_seqs{seqs} and max_num_batched_tokens{budget}",
                      "max_num_seqs")
    limit = (f"limit the batch: {what}, and tune it by the SLA, not by throughput: "
             f"`stepserve sweep --vary {knob}=... --slo {slo}` recommends the largest that "
             "meets it")
    queued = _queued(s)
    if queued is not None:
        return (f"{queued}: the SLO is missed waiting for a slot, so add replicas first "
                f"(`stepserve plan capacity --peak-concurrency N`); then {limit}")
    return limit


# goodput, or every input of the judgement without an SLO
@rule((S.goodput_requests_per_s, S.ttft_p99_s), (S.goodput_requests_per_s, S.mean_step_s),
      (S.goodput_requests_per_s, S.slot_utilization), (S.goodput_requests_per_s, S.waiting_p50))
def throughput_over_experience(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    good, done = s.goodput_requests_per_s, s.throughput_requests_per_s
    if good is not None:
        share = ratio(good, done)
        if share is None or share >= GOODPUT_SHARE_MIN:
            return None
        slo = f" ({s.goodput_slo})" if s.goodput_slo else ""
        return Finding(
            "throughput_over_experience",
            "critical" if share < GOODPUT_SHARE_CRITICAL else "warning",
            f"goodput {good:.3g} req/s is {pct(share)} of the {done:.3g} req/s completed: "
            f"{pct(1 - share)} of completed requests missed the SLO{slo} (alert under "
            f"{GOODPUT_SHARE_MIN:.0%}){_batch_text(s, cfg)}",
            _limit_batch(s, cfg, "ttft_p99_s=..."))
    ttft, step, busy = s.ttft_p99_s, s.mean_step_s, s.slot_utilization
    if ttft is None or not step or busy is None or busy < BUSY_SLOT_UTILIZATION:
        return None
    if not _batch_full(s, cfg):
        return None  # a batch below its slot cap is not too large; unknown: cannot tell
    if s.waiting_p50 is None or _queued(s) is not None:
        return None  # a queue explains the wait (the queue rules); unknown: cannot tell
    if ttft <= TTFT_P99_ALERT_S or ttft < FAR_STEPS * step:
        return None
    return Finding(
        "throughput_over_experience", "warning",
        f"TTFT P99 {ttft:.3g} s is {ttft / step:.0f} mean steps ({step:.3g} s) at a busy "
        f"batch with no queue{_batch_text(s, cfg)}: past the {TTFT_P99_ALERT_S:g} s P99 "
        f"alert and over {FAR_STEPS} steps, far more than a prompt's own prefill takes",
        _limit_batch(s, cfg, f"ttft_p99_s={TTFT_P99_ALERT_S:g}")
        + "; give the bench an SLO (`stepserve bench --goodput ttft:MS`) to measure goodput")
