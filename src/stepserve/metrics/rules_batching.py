"""The night-report incident's rules: held batch slots that produce nothing. The active
ratio (sequences producing a token / slots held) is the early signal the incident names;
slot utilisation below 50% says continuous batching is worth 2x or more.
"""

from __future__ import annotations

from stepserve.metrics.alert_times import (
    ACTIVE_RATIO_MIN,
    SLOT_UTILIZATION_MIN,
    SUSTAIN_STEPS,
    lead,
)
from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import RuleSettings, S, pct, rule
from stepserve.metrics.run_summary import RunSummary


def _active_ratio(s: RunSummary) -> tuple[float | None, str]:
    """(active ratio, which statistic it is): the per-step median (with the mean of the
    per-step ratios beside it) where the run has per-step fields; else slot utilisation,
    the slot-weighted ratio over all steps, which is all a /metrics window can give."""
    median, mean = s.active_ratio_p50, s.active_ratio_mean
    if median is not None:
        tail = f" (mean over steps {pct(mean)})" if mean is not None else ""
        return median, f"in the median step only {pct(median)} of the held batch slots " \
            f"produced a token{tail}"
    if s.slot_utilization is not None:
        # a per-step mean without its median is a live window's ratio of sums, i.e. this
        return s.slot_utilization, ("slot-weighted over all steps (slot utilisation: no "
                                    f"per-step ratios) only {pct(s.slot_utilization)} of "
                                    "the held batch slots produced a token")
    if mean is not None:
        return mean, f"on the mean over steps only {pct(mean)} of the held batch slots " \
            "produced a token"
    return None, ""


@rule((S.active_ratio_p50, S.slot_utilization, S.active_ratio_mean))
def low_active_ratio(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    r, seen = _active_ratio(s)
    if r is None or r >= ACTIVE_RATIO_MIN:
        return None
    measured = lead(s, S.alert_low_active_at_s,
                    ("the active ratio", f"stayed under {ACTIVE_RATIO_MIN:.0%} for "
                     f"{SUSTAIN_STEPS} steps"),
                    S.alert_low_slot_util_at_s,
                    ("slot utilisation since the start", f"stayed under "
                     f"{SLOT_UTILIZATION_MIN:.0%} for {SUSTAIN_STEPS} steps"),
                    "the night-report incident reported that alerting on it would have "
                    "caught the waste about a week earlier")
    return Finding(
        "low_active_ratio", "warning",
        f"{seen}; alert threshold {ACTIVE_RATIO_MIN:.0%}; {measured}",
        "alert on active sequences / concurrency below 30% rather than GPU utilisation (in "
        "the night-report incident it fell to 10 of 64 by step 20 while the GPU looked "
        "unsaturated); then compute slot utilisation and the speedup cap (`stepserve plan "
        "speedup`) before changing the scheduler")


@rule((S.slot_utilization,))
def low_slot_utilization(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    u = s.slot_utilization
    if u is None or u >= SLOT_UTILIZATION_MIN:
        return None
    cap = f"; the cap on a continuous-batching speedup is about 1/{u:.3f} = {1 / u:.1f}x" \
        if u > 0 else ""
    evidence = (f"slot utilisation {pct(u)} (useful output / held slots x steps), below "
                f"{SLOT_UTILIZATION_MIN:.0%}{cap}")
    if cfg.batching == "continuous":
        action = ("the batch is already continuous, so held slots idle for another reason: "
                  "requests waiting for KV blocks, preempted, or mid-prefill; check "
                  "preemptions and KV capacity (`stepserve plan capacity`)")
    else:
        action = ("switch to continuous batching (scheduler.batching: continuous), which is "
                  "worth 2x or more below 50%; compute the speedup cap for this length mix "
                  "first (`stepserve plan speedup`) and promise that, not the folk 10-20x")
    return Finding("low_slot_utilization", "warning", evidence, action)
