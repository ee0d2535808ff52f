"""The alert rules (`stepserve doctor`): each a check over a RunSummary that declares the
fields it needs and returns one Finding or None; the settings only sharpen the advice.
Thresholds come from the incidents' post-mortems and the tail-latency table (docs/guide.md
tells each story); an early signal's lead is measured on the run's own series."""

from __future__ import annotations

import math
import typing
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any, Protocol

from stepserve.core.end_reasons import RejectReason, end_reason
from stepserve.core.output import StepRecord
from stepserve.metrics.percentiles import ratio
from stepserve.metrics.quantile_bounds import verdict_summary
from stepserve.metrics.request_metrics import RequestLatencies
from stepserve.metrics.run_summary import RunSummary, field_name
from stepserve.metrics.step_metrics import Steps, merged_level, per_replica, step_end

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One rule that fired, with the numbers it saw and what to change; `run` names the
    run it fired on where a result holds several."""

    rule: str
    severity: str  # critical | warning | info
    evidence: str  # what was seen, with the numbers
    action: str  # what to change, naming the setting
    run: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity = {self.severity!r}: must be one of "
                             f"{', '.join(SEVERITIES)}")

    def on_run(self, run: str) -> Finding:
        return replace(self, run=run)

    def to_json(self) -> dict[str, str]:
        """{"run"?, "rule", "severity", "evidence", "action"}: the published row."""
        row = {"run": self.run} if self.run is not None else {}
        return {**row, "rule": self.rule, "severity": self.severity,
                "evidence": self.evidence, "action": self.action}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        run = data.get("run")
        return cls(str(data["rule"]), str(data["severity"]), str(data.get("evidence", "")),
                   str(data.get("action", "")), None if run is None else str(run))


@dataclass(frozen=True)
class RuleSettings:
    """The settings the rules' advice names (the chunk cap actually set, max_num_seqs
    now): from the summary where it carries them (sim/run.py copies them in), else from
    a run's config (flat, or nested by section like EngineConfig's JSON), else the run's
    batching mode. None where unknown: the advice then speaks in general terms."""

    batching: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    budget_order: str | None = None
    replicas: int | None = None
    max_model_len: int | None = None
    max_waiting: int | None = None
    max_queue_time_s: float | None = None

    @classmethod
    def of(cls, summary: RunSummary, config: Mapping[str, Any] | None = None,
           batching: str | None = None) -> RuleSettings:
        def pick(name: str, kind: type) -> Any:
            # a setting no summary carries (max_model_len) comes from the config only
            for value in (getattr(summary, name, None), _from_config(config or {}, name)):
                if value is not None:
                    return _as(kind, value)
            return None

        found = cls(**{name: pick(name, kind) for name, kind in SETTING_TYPES.items()})
        return replace(found, batching=found.batching or batching)


# each setting's type: int, float or str
SETTING_TYPES: dict[str, type] = {name: typing.get_args(hint)[0] for name, hint
                                  in typing.get_type_hints(RuleSettings).items()}


def _from_config(config: Mapping[str, Any], key: str) -> Any:
    """`key` at the config's top level, else one section deep."""
    if config.get(key) is not None:
        return config[key]
    for section in config.values():
        if isinstance(section, Mapping) and section.get(key) is not None:
            return section[key]
    return None


def _as(kind: type, value: Any) -> Any:
    """A setting of the expected kind, else None (a file may hold anything)."""
    number = (isinstance(value, int) and not isinstance(value, bool)) \
        or (isinstance(value, float) and math.isfinite(value))
    if kind is int:
        return int(value) if number and (isinstance(value, int) or value.is_integer()) \
            else None
    if kind is float:
        return float(value) if number else None
    return value if isinstance(value, kind) else None


Check = Callable[[RunSummary, RuleSettings], "Finding | None"]


@dataclass(frozen=True)
class Rule:
    """A check and the RunSummary fields it needs, in groups: `@rule((S.preemptions,),
    (S.p99_p50_e2e_ratio, S.p99_p50_ttft_ratio))` needs the preemptions and at least one
    of the two ratios (a name that is no field fails at import). A field that is also a
    setting (S.max_num_seqs) is there when the summary or the run's config gives it. When
    every field of a group is None (a live scrape or another tool's file may lack it) the
    rule cannot run: it stays silent rather than guess, and `missing` says what it lacks.
    The fields it needs are the ones it compares: where a server's buckets were wide, it
    reads those at their bounds (quantile_bounds.py)."""

    check: Check
    needs: tuple[tuple[str, ...], ...]  # RunSummary field names; one of each group

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def compared(self) -> frozenset[str]:
        return frozenset(name for group in self.needs for name in group)

    def missing(self, summary: RunSummary, settings: RuleSettings | None = None
                ) -> list[str]:
        """The groups of inputs the summary (and the settings) have no value for, as
        "a or b"."""
        seen = verdict_summary(summary, self.compared)
        settings = settings or RuleSettings.of(summary)

        def known(name: str) -> bool:
            return getattr(seen, name) is not None or (
                name in SETTING_TYPES and getattr(settings, name) is not None)

        return [" or ".join(group) for group in self.needs
                if not any(known(name) for name in group)]

    def __call__(self, summary: RunSummary, settings: RuleSettings | None = None
                 ) -> Finding | None:
        settings = settings or RuleSettings.of(summary)
        if self.missing(summary, settings):
            return None
        return self.check(verdict_summary(summary, self.compared), settings)


def rule(*needs: tuple[Any, ...]) -> Callable[[Check], Rule]:
    """Declare a rule and the RunSummary fields it needs (see Rule)."""
    groups = tuple(tuple(field_name(f) for f in group) for group in needs)
    return lambda check: Rule(check, groups)


S = RunSummary  # a rule's inputs are its fields: @rule((S.preemptions,))


def pct(x: float) -> str:
    """A share as a rule's evidence writes it: 0.1234 -> "12.3%"."""
    return f"{x:.1%}"


def _now(setting: object) -> str:
    """" (now N)" after a setting's name where it is known."""
    return "" if setting is None else f" (now {setting})"


def _from(setting: object) -> str:
    """" from N" after "raise/lower a setting" where it is known."""
    return "" if setting is None else f" from {setting}"


# ---- when each alert would first have fired ----
# The incidents' early signals and the alerts they ran ahead of; `alert_times` finds when
# a run first crossed each line, `lead` words the gap as this run measured it (an
# incident's own figure is only quoted as what that incident reported).

QUEUE_ALERT = 10  # promo-spike: "它到 10 时 P99 还是 1.8 s"
TTFT_P99_ALERT_S = 5.0  # promo-spike: the P99 alert the team had, "P99 超 5 s"
PREFILL_STEP_SHARE_MAX = 0.70  # mixed-pool: prefill-only steps
ZERO_DECODE_STEP_SHARE_MAX = 0.10  # mixed-pool: steps that starved decode-ready sequences
ACTIVE_RATIO_MIN = 0.30  # night-report: active sequences / concurrency
SLOT_UTILIZATION_MIN = 0.50  # below it continuous batching is worth >= 2x
# A rolling P99 over the first tokens of the last minute, as a dashboard's 1-minute
# window would show it: "over 5 s" once more than 1% of them came later than 5 s.
TTFT_WINDOW_S = 60.0
TTFT_TAIL_SHARE = 0.01
# A share of steps is taken over the last 100 steps: over fewer, a run's start-up (every
# step a first prefill) reads as a level.
STEP_WINDOW = 100
# The active ratio and slot utilisation must stay under their lines this many steps in a
# row (an alert's `for:` clause): a step between batch members, or a first prompt's
# chunks, is no level.
SUSTAIN_STEPS = 10
# what each alert time's line is, as a lead words it: (subject, what it did)
ALERT_LINES = {
    "alert_queue_at_s": ("the waiting queue", f"reached {QUEUE_ALERT}"),
    "alert_ttft_p99_at_s": ("TTFT P99", f"passed {TTFT_P99_ALERT_S:g} s"),
    "alert_prefill_share_at_s": (f"the last {STEP_WINDOW} steps",
                                 f"passed {PREFILL_STEP_SHARE_MAX:.0%} prefill-only or "
                                 f"{ZERO_DECODE_STEP_SHARE_MAX:.0%} zero-decode"),
    "alert_low_active_at_s": ("the active ratio", f"stayed under {ACTIVE_RATIO_MIN:.0%} "
                              f"for {SUSTAIN_STEPS} steps"),
    "alert_low_slot_util_at_s": ("slot utilisation since the start", "stayed under "
                                 f"{SLOT_UTILIZATION_MIN:.0%} for {SUSTAIN_STEPS} steps"),
}


def _first_queue_at(replicas: list[list[StepRecord]]) -> float | None:
    ts, vs = merged_level(replicas, lambda s: s.num_waiting)
    return next((t for t, v in zip(ts, vs, strict=True) if v >= QUEUE_ALERT), None)


def _first_ttft_p99_at(ms: Sequence[RequestLatencies]) -> float | None:
    """When the rolling TTFT P99 first passed TTFT_P99_ALERT_S, observed (as a server's
    histogram is) when each first token came out."""
    firsts = sorted((m.arrival_time + m.ttft_s, m.ttft_s) for m in ms if m.ttft_s is not None)
    window: deque[tuple[float, float]] = deque()
    late = 0
    for t, ttft in firsts:
        window.append((t, ttft))
        late += ttft > TTFT_P99_ALERT_S
        while window[0][0] <= t - TTFT_WINDOW_S:
            late -= window.popleft()[1] > TTFT_P99_ALERT_S
        if late > TTFT_TAIL_SHARE * len(window):
            return t
    return None


def _first_prefill_share_at(recs: list[StepRecord]) -> float | None:
    prefill = list(accumulate((s.is_prefill_only for s in recs), initial=0))
    zero = list(accumulate((s.is_zero_decode for s in recs), initial=0))
    for end in range(STEP_WINDOW, len(recs) + 1):  # the STEP_WINDOW steps before `end`
        start = end - STEP_WINDOW
        if prefill[end] - prefill[start] > PREFILL_STEP_SHARE_MAX * STEP_WINDOW \
                or zero[end] - zero[start] > ZERO_DECODE_STEP_SHARE_MAX * STEP_WINDOW:
            return step_end(recs[end - 1])
    return None


def _first_sustained_at(held: list[StepRecord], below: Iterable[bool]) -> float | None:
    """When `below` (one per step of `held`) had been true for SUSTAIN_STEPS steps."""
    run = 0
    for s, low in zip(held, below, strict=True):
        run = run + 1 if low else 0
        if run == SUSTAIN_STEPS:
            return step_end(s)
    return None


def alert_times(ms: Sequence[RequestLatencies], steps: Steps) -> RunSummary:
    """The alert_*_at_s fields of a run with step records (nothing without them)."""
    replicas = per_replica(steps)
    recs = sorted((s for r in replicas for s in r), key=step_end)
    if not recs:
        return RunSummary()
    t0 = min([s.start_s for s in recs] + [m.arrival_time for m in ms])
    held = [s for s in recs if s.slots_held > 0]
    # slot utilisation since the start: useful tokens / slots held, so far
    so_far = zip(accumulate(s.num_active for s in held), accumulate(s.slots_held for s in held),
                 strict=True)

    def since(t: float | None) -> float | None:
        return None if t is None else t - t0

    return RunSummary.of(
        alert_queue_at_s=since(_first_queue_at(replicas)),
        alert_ttft_p99_at_s=since(_first_ttft_p99_at(ms)),
        alert_prefill_share_at_s=since(_first_prefill_share_at(recs)),
        alert_low_active_at_s=since(_first_sustained_at(
            held, (s.num_active < ACTIVE_RATIO_MIN * s.slots_held for s in held))),
        alert_low_slot_util_at_s=since(_first_sustained_at(
            held, (active < SLOT_UTILIZATION_MIN * slots for active, slots in so_far))))


def _secs(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def lead(s: RunSummary, early: object, late: object, reported: str) -> str:
    """How far the early signal ran ahead of the late alert in this run, e.g. "in this
    run the waiting queue reached 10 at t=81 s, 143 s before TTFT P99 passed 5 s", then
    what the incident reported, labelled as such. `early` and `late` are alert time
    fields (S.NAME), worded by ALERT_LINES."""
    e_name, l_name = field_name(early), field_name(late)
    (e_who, e_did), (l_who, l_did) = ALERT_LINES[e_name], ALERT_LINES[l_name]
    if e_name not in s.reported or l_name not in s.reported:
        return f"this summary has no time series to measure the lead ({reported})"
    e, la = getattr(s, e_name), getattr(s, l_name)
    if e is None:
        seen = f"in this run {e_who} never {e_did}"
    elif la is None:
        seen = f"in this run {e_who} {e_did} at t={_secs(e)} s; {l_who} never {l_did}"
    elif e <= la:
        seen = (f"in this run {e_who} {e_did} at t={_secs(e)} s, {_secs(la - e)} s before "
                f"{l_who} {l_did}")
    else:
        seen = (f"in this run {l_who} {l_did} at t={_secs(la)} s, before {e_who} {e_did} "
                f"(t={_secs(e)} s): no lead")
    return f"{seen} ({reported})"


# ---- the incidents' queue, capacity, preemption and chunk-cap rules ----

CAPACITY_TAIL_RATIO = 10.0  # promo-spike: P99/P50 over this with preemptions > 0
QUEUE_CLIMB_MIN_STEPS = 10  # a climb over fewer steps is a burst of arrivals, not a trend
KV_FULL = 0.95  # KV usage at which running is limited by blocks rather than slots
WAITING_MOST_OF_RUN = 0.50  # a queue in more than half the samples
TTFT_TAIL_RATIO = 5.0  # "mean TTFT normal, P99 high"
TPOT_NORMAL_STEPS = 1.5  # TPOT P50 within this many mean steps is "normal"
PREFILL_TOKEN_SHARE_MIN = 0.5  # prefill fills the steps: most computed tokens are prefill


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
    order_note = _now("prefill_first") if cfg.budget_order == "prefill_first" else ""
    measured = lead(s, S.alert_prefill_share_at_s, S.alert_ttft_p99_at_s,
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
    return Finding(
        "capacity", "critical",
        f"P99/P50 {shown} (alert over {CAPACITY_TAIL_RATIO:g}) with {int(pre)} preemptions: "
        "a capacity problem",
        f"add replicas first, then lower max_num_seqs{_now(cfg.max_num_seqs)} to what KV "
        "holds at the maximum length, not the mean (`stepserve plan capacity`), and cap "
        "max_waiting so excess load fails fast; do not start by tweaking the batch size")


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
    measured = lead(s, S.alert_queue_at_s, S.alert_ttft_p99_at_s,
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


def _waiting_reasons(s: RunSummary) -> str:
    """", by reason: capacity peak 28, deferred peak 0" where the server splits its queue
    (vLLM), else ""."""
    held = s.waiting_by_reason_max
    if not isinstance(held, Mapping) or not held:
        return ""
    peaks = _counts(held)  # a file may hold anything: numbers only
    return "; by reason: " + ", ".join(f"{reason} peak {peaks.get(reason, 0):g}"
                                       for reason in sorted(map(str, held)))


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
        f"peak {s.waiting_max}{_waiting_reasons(s)}); {why}{offered_text}: running "
        "capacity is below the offered concurrency",
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


# ---- batching (the night-report incident: held batch slots that produce nothing) ----

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
    measured = lead(s, S.alert_low_active_at_s, S.alert_low_slot_util_at_s,
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


# ---- prefill stalls ----
# Prefill-heavy steps that stall decoding or first tokens. Where prefill goes first (or
# decode was skipped), a running sequence waits out the whole step: over 5 decode steps is
# a stall. Where decode goes first, every running sequence rides in each step and its TPOT
# pays for the chunk steps: a stall is then over 20x the TPOT P50, twice the ~10x P99 step
# of the mixed-pool incident's own fix (docs/guide.md).

STALL_RATIO = 5.0  # the slow steps (or token gaps) over this many decode steps: a stall
RIDE_ALONG_RATIO = 20.0  # decode first: the slow steps over this many TPOT P50s
DECODE_SKIPPED_MAX = 0.01  # a zero-decode share under 1%: decode was not skipped
STALL_PREFILL_SHARE_MIN = 0.2  # below it prompts are too small a share to stall anything
STALL_TARGET_RATIO = 3.0  # advice: a budget whose fullest step costs ~3 decode steps


def _prefill_share(s: RunSummary) -> float | None:
    """Prefill's share of the computed tokens; from a client's token counts (prompts /
    prompts + outputs) where no engine or scrape measured it."""
    if s.prefill_token_share is not None:
        return s.prefill_token_share
    if s.prompt_tokens and s.output_tokens is not None:
        return s.prompt_tokens / (s.prompt_tokens + s.output_tokens)
    return None


def _stall_budget(budget: int, pace: float, stall: float) -> int:
    """A step budget whose fullest step costs about STALL_TARGET_RATIO decode steps, if
    a prefill-heavy step's time grows with its tokens: a power of two, at least 64."""
    want = budget * STALL_TARGET_RATIO * pace / stall
    power = 64
    while power * 2 <= want:
        power *= 2
    return min(power, budget)


@rule((S.step_p99_s, S.itl_p99_s), (S.decode_step_p50_s, S.tpot_p50_s),
      (S.prefill_token_share, S.prompt_tokens))
def prefill_stalls_decode(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    stall, stall_name = ((s.step_p99_s, "step time P99") if s.step_p99_s is not None
                         else (s.itl_p99_s, "ITL P99"))
    pace, pace_name = ((s.decode_step_p50_s, "median decode step")
                       if s.decode_step_p50_s is not None else (s.tpot_p50_s, "TPOT P50"))
    share = _prefill_share(s)
    if stall is None or not pace or share is None or stall <= STALL_RATIO * pace:
        return None
    if share < STALL_PREFILL_SHARE_MIN:
        return None  # prompts are a small share of the work: long steps come from elsewhere
    seen = [f"{stall_name} {stall:.3g} s is {stall / pace:.0f}x the {pace_name} "
            f"({pace:.3g} s; alert over {STALL_RATIO:g}x)"]
    # decode first and no step skipped it: running sequences are never held back by a
    # prefill step, only slowed by the ones they share
    ride_along = cfg.budget_order == "decode_first" \
        and (s.zero_decode_step_share or 0) < DECODE_SKIPPED_MAX
    if ride_along and s.tpot_p50_s:
        tpot = s.tpot_p50_s
        if stall <= RIDE_ALONG_RATIO * tpot:
            return None  # a bounded step every running sequence rode in: its pace paid
        seen.append(f"{stall / tpot:.0f}x the TPOT P50 ({tpot:.3g} s), which with decode "
                    f"first pays for the prefill steps it rides in (alert over "
                    f"{RIDE_ALONG_RATIO:g}x)")
    seen.append(f"prefill is {pct(share)} of the tokens")
    if s.step_max_s is not None:
        seen.append(f"the longest step took {s.step_max_s:.3g} s")
    if s.ttft_p50_s is not None:
        seen.append(f"TTFT P50 {s.ttft_p50_s:.3g} s")
    budget = cfg.max_num_batched_tokens
    if budget is not None:
        new = _stall_budget(budget, pace, stall)
        change = (f"lower max_num_batched_tokens from {budget} toward {new} (where a step's "
                  f"time grows with its tokens, that makes the fullest step ~"
                  f"{STALL_TARGET_RATIO:g} decode steps) and long_prefill_token_threshold "
                  f"to {max(new // 2, 1)}")
    else:
        change = ("lower max_num_batched_tokens (the step budget) to what this machine "
                  "prefills in a few decode steps, and cap each request's chunk "
                  "(long_prefill_token_threshold)")
    return Finding(
        "prefill_stalls_decode", "warning",
        "; ".join(seen) + ": prefill-heavy steps stall decoding",
        f"{change}, budget_order decode_first; check the choice on this machine's step "
        "times first: `stepserve profile --out cost.json`, then `stepserve sweep --cost "
        "cost.json --vary max_num_batched_tokens=...` on this workload")


# ---- outcomes: requests refused at admission, and timed out in the queue ----
# The promo-spike incident's 429s at 0.1% were healthy and its timeouts went from 0.5% to
# 12%: 1% is ten times the healthy rejection level (warn), 10% the spike's scale (critical).

OUTCOME_WARN_SHARE = 0.01
OUTCOME_CRITICAL_SHARE = 0.10
_OUTCOME_LINES = (f" (alert at {OUTCOME_WARN_SHARE:.0%}, critical at "
                  f"{OUTCOME_CRITICAL_SHARE:.0%})")

# an HTTP bench sees only status codes: a 429 is the server's queue cap (ours, vLLM's
# and SGLang's answer a full queue so); a 400 whose message names the context length
_CONTEXT_WORDS = ("max_model_len", "context length", "context_length")


# vLLM's admission caps, its `reason` labels (both answer 503 at the API server)
VLLM_QUEUE_CAPS = {
    "max_num_queued_reqs": (
        "by vLLM's cap on requests in flight, max_num_queued_reqs (waiting + running)",
        "add replicas (`stepserve plan capacity --peak-concurrency N`), or raise "
        "max_num_queued_reqs (about replicas x max_num_seqs plus the queue depth the SLO "
        "allows)"),
    "max_num_queued_tokens": (
        "by vLLM's cap on prompt tokens awaiting prefill, max_num_queued_tokens",
        "add prefill capacity (replicas), or raise max_num_queued_tokens if the TTFT "
        "target allows the longer prefill backlog"),
}


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
        return (f"prompt + max_tokens longer than max_model_len{limit}",
                f"raise max_model_len{_from(cfg.max_model_len)} if KV holds it (`stepserve plan "
                "capacity`), or route long prompts elsewhere (their own pool: `--pools`) and "
                "cap request length at the client")
    if reason == RejectReason.QUEUE_FULL.value:
        cap = f" = {cfg.max_waiting}" if cfg.max_waiting else ""
        if cap and cfg.replicas and cfg.replicas > 1:
            cap += f" per replica (x {cfg.replicas})"
        return (f"by the queue cap max_waiting{cap}",
                "add replicas (`stepserve plan capacity --peak-concurrency N`), or raise "
                f"max_waiting{_from(cfg.max_waiting or None)} if "
                "the latency SLO allows the longer queue")
    if reason == RejectReason.EMPTY_PROMPT.value:
        return "for an empty prompt", "fix the client that sends empty prompts"
    if reason in VLLM_QUEUE_CAPS:
        return VLLM_QUEUE_CAPS[reason]
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
        f"{'; '.join(seen)}{_OUTCOME_LINES}",
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
        "; ".join(seen) + _OUTCOME_LINES,
        f"{setting} is failing requests fast, as set: the cause is running capacity below "
        "the offered load: add replicas (`stepserve plan capacity --peak-concurrency N`); "
        "where preemption holds requests back, lower max_num_seqs to what KV holds; raise "
        f"max_queue_time_s{raise_it} only if the latency SLO allows the longer wait")


# ---- experience (the tail-latency table's second and fourth rows) ----
# TPOT P99 over 5x its P50, the TTFT row's line; simulated incident configurations run at
# 1.0-3.1, the mixed-pool incident's spike was over 100x.
TPOT_TAIL_RATIO = 5.0
TPOT_MEAN_NORMAL = 1.5  # a mean within 1.5x the median: the typical stream is fine
STEP_SWING_RATIO = 3.0  # step time P99 over 3x its P50: the batch's make-up swings
# Fewer than 9 in 10 completed requests meeting the SLO is an SLO missed (goodput is
# counted against the SLO a bench run was given); fewer than half is critical.
GOODPUT_SHARE_MIN = 0.90
GOODPUT_SHARE_CRITICAL = 0.50
# Without an SLO: a full batch (90% of max_num_seqs x replicas, every held slot busy) and
# no queue, yet TTFT P99 past 5 s and over 50 steps: the batch shares the steps too thinly.
# A batch that never filled its slots is not "too large"; E2E is no yardstick (a long
# answer takes its steps by design).
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
    if s.preemptions:
        causes.append(f"{int(s.preemptions)} preemptions (a preempted stream waits to be "
                      "recomputed or swapped back in)")
    if s.kv_usage_max is not None and s.kv_usage_max >= KV_FULL:
        causes.append(f"KV usage peaked at {pct(s.kv_usage_max)} (memory pressure)")
    if causes:
        fixes.append(f"lower concurrency (max_num_seqs{_from(cfg.max_num_seqs)}) to what KV "
                     "holds with headroom (`stepserve plan capacity` keeps 15%)")
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
    budget = _now(cfg.max_num_batched_tokens)
    if _batch_full(s, cfg) is False:
        what, knob = (f"the step budget: lower max_num_batched_tokens{budget} (running never "
                      f"filled max_num_seqs {cfg.max_num_seqs}, so lowering that changes "
                      "nothing)", "max_num_batched_tokens")
    else:
        what = f"lower max_num_seqs{_now(cfg.max_num_seqs)} and max_num_batched_tokens{budget}"
        knob = "max_num_seqs"
    limit = (f"limit the batch: {what}, and tune it by the SLA, not by throughput: "
             f"`stepserve sweep --vary {knob}=... --slo {slo}` recommends the largest that "
             "meets it")
    queued = _queued(s)
    if queued is not None:
        return (f"{queued}: the SLO is missed waiting for a slot, so add replicas first "
                f"(`stepserve plan capacity --peak-concurrency N`); then {limit}")
    return limit


# goodput, or every input of the judgement without an SLO (max_num_seqs: whether the
# batch was full, which a batch below its slot cap is not)
@rule((S.goodput_requests_per_s, S.ttft_p99_s), (S.goodput_requests_per_s, S.mean_step_s),
      (S.goodput_requests_per_s, S.slot_utilization), (S.goodput_requests_per_s, S.waiting_p50),
      (S.goodput_requests_per_s, S.max_num_seqs))
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
        return None  # a batch below its slot cap is not too large
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


# ---- the prefix cache: a cache that thrashes ----
# The workload repeats much of its prompts (the repeated share: what a cache that never
# evicted could give; cold misses are already out of it), yet the cache gave under half.

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
    routed = f" over {cfg.replicas} replicas" if (cfg.replicas or 0) > 1 else ""
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


# ---- the host: a shared CPU ----
# Other processes on the engine's cores slow its steps far more than their CPU share says
# (docs/guide.md has the measurement). An idle engine is left alone, and readings from the
# bench client's machine (`cpu_source` "client") are not the engine's. It is no member of
# RULES: `diagnose` puts its finding first and cautions every latency finding.

OTHERS_CORES_MIN = 0.25  # other processes' CPU, in cores, averaged over the run
WAIT_SHARE_MIN = 0.10  # of the engine threads' time, spent waiting for a core
CPU_SHARED = "cpu_shared"
# the rules whose findings are about time (latency, queues, steps), which a shared CPU
# slows whatever the settings
LATENCY_RULES = frozenset({
    "capacity", "queue_growing", "running_below_offered", "prefill_stalls_decode",
    "tail_ttft_from_prefill", "tpot_tail", "throughput_over_experience", "timeouts",
})
NOT_THE_SCHEDULER = "the scheduler's settings are not the cause"
_CPU_CAVEAT = ("; but first: the CPU was shared over this run (cpu_shared), which slows "
               "every step whatever the settings: fix that before changing them")


@rule((S.cpu_others_cores, S.cpu_wait_share))
def cpu_shared(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    if s.cpu_source == "client" or s.steps == 0:
        return None
    others, wait = s.cpu_others_cores, s.cpu_wait_share
    crowded = others is not None and others >= OTHERS_CORES_MIN
    waited = wait is not None and wait >= WAIT_SHARE_MIN
    if not (crowded or waited):
        return None
    seen = []
    if others is not None:
        of = f" of {s.cpu_usable:g} cores" if s.cpu_usable else ""
        seen.append(f"other processes used {others:.2f}{of}")
    if wait is not None:
        seen.append(f"the engine's threads waited {wait:.0%} of their time for a core")
    if s.step_time_over_quiet is not None:
        seen.append(f"steps took {s.step_time_over_quiet:.1f}x their quiet time")
    return Finding(
        CPU_SHARED, "warning",
        f"the CPU is shared: {'; '.join(seen)} (alert at {OTHERS_CORES_MIN:g} cores or "
        f"{WAIT_SHARE_MIN:.0%} waiting); every step waits for the other work, so latency "
        "and throughput say little about the engine's settings",
        "move the other work off these cores, or pin them apart (taskset); the engine "
        "already steps on fewer threads while other work keeps whole cores busy, and "
        f"--threads N fixes the count; {NOT_THE_SCHEDULER}")


# Findings are listed most severe first, in this order within a severity.
RULES: tuple[Rule, ...] = (
    capacity, chunk_cap_eats_budget, queue_growing, running_below_offered,
    preemption_nonzero, prefill_stalls_decode, tail_ttft_from_prefill,
    low_slot_utilization, low_active_ratio, prefix_cache_thrash, rejections, timeouts,
    tpot_tail, throughput_over_experience,
)


# ---- applying them ----

class DiagnosedRun(Protocol):
    """A run the rules can read: a result's run (sim/run.py, bench/results.py), a sweep
    point, or a run of a file the doctor loaded."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> RunSummary: ...

    def rule_settings(self) -> RuleSettings: ...


def diagnose(summary: RunSummary, settings: RuleSettings | None = None) -> list[Finding]:
    """Every rule that fires, most severe first (rule order within a severity); a shared
    CPU's finding before them all, whatever the severities, each latency finding's action
    then saying to fix that first."""
    settings = settings or RuleSettings.of(summary)
    found = [f for rule in RULES if (f := rule(summary, settings)) is not None]
    found.sort(key=lambda f: SEVERITIES.index(f.severity))
    shared = cpu_shared(summary, settings)
    if shared is None:
        return found
    return [shared, *(replace(f, action=f.action + _CPU_CAVEAT) if f.rule in LATENCY_RULES
                      else f for f in found)]


def unevaluable(summary: RunSummary, settings: RuleSettings | None = None
                ) -> dict[str, list[str]]:
    """{rule: the inputs it lacks ("a or b" per group)} for each rule the summary (and the
    settings) cannot feed, in rule order."""
    settings = settings or RuleSettings.of(summary)
    return {rule.name: missing for rule in RULES
            if (missing := rule.missing(summary, settings))}


def findings_for(runs: Iterable[DiagnosedRun]) -> list[Finding]:
    """Every rule that fires on each run, each finding naming its run."""
    return [f.on_run(run.name) for run in runs
            for f in diagnose(run.summary, run.rule_settings())]
