"""Rules on how requests ended: the share refused at admission (by reason, naming the
setting that refused them) and the share that timed out in the queue.

Thresholds, from the promo-spike incident's own figures: 429s at 0.1% were its healthy
level (it ruled out a retry storm on them) and timeouts went from 0.5% to 12% at the
spike. A share of 1% is ten times that healthy rejection level and twice the healthy
timeout level: warn. 10% is the scale of the spike's 12%: critical, a tenth of the
offered load is being turned away.
"""

from __future__ import annotations

from collections.abc import Mapping

from stepserve.core.end_reasons import RejectReason, end_reason
from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import RuleSettings, S, pct, rule
from stepserve.metrics.run_summary import RunSummary

OUTCOME_WARN_SHARE = 0.01
OUTCOME_CRITICAL_SHARE = 0.10

# an HTTP bench sees only status codes: a 429 is the server's queue cap (ours, vLLM's
# and SGLang's answer a full queue so); a 400 whose message names the context length
_CONTEXT_WORDS = ("max_model_len", "context length", "context_length")


def _counts(value: Mapping | None) -> dict[str, float]:
    """The numeric counts of a reason -> count mapping (a file may hold anything)."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}


def _from_http(s: RunSummary) -> dict[str, float]:
    """Rejections by reason as an HTTP client saw them (bench's `errors`)."""
    errors, examples = _counts(s.errors), s.error_examples or {}
    found: dict[str, float] = {}
    full = f"http_{end_reason(RejectReason.QUEUE_FULL).http_status}"
    if errors.get(full):
        found[RejectReason.QUEUE_FULL.value] = errors[full]
    too_long = f"http_{end_reason(RejectReason.TOO_LONG).http_status}"  # any 400's
    example = str(examples.get(too_long) or "").lower()
    if errors.get(too_long) and any(word in example for word in _CONTEXT_WORDS):
        found[RejectReason.TOO_LONG.value] = errors[too_long]
    return found


def rejections_by_reason(s: RunSummary) -> dict[str, float]:
    """{reason: count}: the engine's count by reason, else the client's status codes;
    rejections the engine counted without a reason are "unknown"."""
    by_reason = _counts(s.rejected_by_reason)
    if s.requests_rejected is None and s.rejected_by_reason is None:
        return _from_http(s)
    unnamed = (s.requests_rejected or 0) - sum(by_reason.values())
    return {**by_reason, "unknown": unnamed} if unnamed > 0 else by_reason


def _severity(share: float) -> str:
    return "critical" if share >= OUTCOME_CRITICAL_SHARE else "warning"


def _why_and_fix(reason: str, cfg: RuleSettings) -> tuple[str, str]:
    """(what refused them, what to change) for one reject reason."""
    if reason == RejectReason.TOO_LONG.value:
        limit = f" ({cfg.max_model_len})" if cfg.max_model_len is not None else ""
        raise_it = f" from {cfg.max_model_len}" if cfg.max_model_len is not None else ""
        return (f"prompt + max_tokens longer than max_model_len{limit}",
                f"raise max_model_len{raise_it} if KV "
                "holds it (`stepserve plan capacity`), or route long prompts elsewhere (their "
                "own pool: `--pools`) and cap request length at the client")
    if reason == RejectReason.QUEUE_FULL.value:
        cap = f" = {cfg.max_waiting}" if cfg.max_waiting else ""
        if cap and cfg.replicas and cfg.replicas > 1:
            cap += f" per replica (x {cfg.replicas})"
        return (f"by the queue cap max_waiting{cap}",
                "add replicas (`stepserve plan capacity --peak-concurrency N`), or raise "
                f"max_waiting{' from ' + str(cfg.max_waiting) if cfg.max_waiting else ''} if "
                "the latency SLO allows the longer queue")
    if reason == RejectReason.EMPTY_PROMPT.value:
        return "for an empty prompt", "fix the client that sends empty prompts"
    return (f"for reason {reason!r}",
            "read the server's request_rejected counter by reason for the cause")


@rule((S.requests_total,), (S.requests_rejected, S.rejected_by_reason, S.errors))
def rejections(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    total = s.requests_total
    by_reason = rejections_by_reason(s)
    rejected = sum(by_reason.values())
    if not total or rejected / total < OUTCOME_WARN_SHARE:
        return None
    share = rejected / total
    ranked = sorted(by_reason.items(), key=lambda kv: -kv[1])
    seen, fixes = [], []
    for reason, n in ranked:
        why, fix = _why_and_fix(reason, cfg)
        seen.append(f"{pct(n / total)} {why} ({int(n)})")
        fixes.append(f"{why}: {fix}")
    return Finding(
        "rejections", _severity(share),
        f"{pct(share)} of {int(total)} requests were rejected at admission: "
        f"{'; '.join(seen)} (alert at {OUTCOME_WARN_SHARE:.0%}, critical at "
        f"{OUTCOME_CRITICAL_SHARE:.0%})",
        "; ".join(fixes))


@rule((S.requests_total,), (S.requests_timed_out,))
def timeouts(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    total, timed_out = s.requests_total, s.requests_timed_out
    if not total or not timed_out or timed_out / total < OUTCOME_WARN_SHARE:
        return None
    share = timed_out / total
    limit = cfg.max_queue_time_s
    setting = f"queue.max_queue_time_s = {limit:g} s" if limit else "queue.max_queue_time_s"
    seen = [f"{pct(share)} of {int(total)} requests ({int(timed_out)}) timed out waiting "
            f"to run, past {setting}"]
    if s.waiting_max is not None:
        seen.append(f"the waiting queue peaked at {s.waiting_max:g}")
    if s.queue_time_p99_s is not None:
        seen.append(f"queue time P99 of those that ran {s.queue_time_p99_s:.3g} s")
    raise_it = f" from {limit:g} s" if limit else ""
    return Finding(
        "timeouts", _severity(share),
        "; ".join(seen) + f" (alert at {OUTCOME_WARN_SHARE:.0%}, critical at "
        f"{OUTCOME_CRITICAL_SHARE:.0%})",
        f"{setting} is failing requests fast, as set: the cause is running capacity below "
        "the offered load: add replicas (`stepserve plan capacity --peak-concurrency N`); "
        "where preemption holds requests back, lower max_num_seqs to what KV holds; raise "
        f"max_queue_time_s{raise_it} only if the latency SLO allows the longer wait")
