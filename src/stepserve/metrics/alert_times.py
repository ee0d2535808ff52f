"""When each of the incidents' alerts would first have fired in a run, timed from the
run's own series, and the lead of an early signal over the late alert it precedes.

The incidents name three early signals and what they ran ahead of: the waiting queue
reaching 10 before TTFT P99 passed 5 s (promo-spike), the prefill-only share of steps
passing 70% (or zero-decode steps 10%) before the TTFT alert (mixed-pool), active
sequences / slots held falling under 30% before slot utilisation showed the waste
(night-report). `alert_times` finds, in a run's requests and step records, the first
moment each line was crossed; `lead` words the gap as this run measured it. An incident's
own figure ("about 20 minutes") is only ever quoted as what that incident reported.

Times are seconds from the run's start (its first arrival or first step). A time the run
measured but never reached is reported as None; a summary without the series does not
report the field at all, and `lead` then says there was nothing to time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from stepserve.core.output import StepRecord
from stepserve.metrics.request_metrics import RequestLatencies
from stepserve.metrics.run_summary import RunSummary, field_name
from stepserve.metrics.step_metrics import Steps, merged_level, per_replica

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
    window: deque[StepRecord] = deque()
    prefill = zero = 0
    for s in recs:
        window.append(s)
        prefill += s.is_prefill_only
        zero += s.is_zero_decode
        if len(window) > STEP_WINDOW:
            old = window.popleft()
            prefill -= old.is_prefill_only
            zero -= old.is_zero_decode
        if len(window) == STEP_WINDOW and (prefill > PREFILL_STEP_SHARE_MAX * STEP_WINDOW
                                           or zero > ZERO_DECODE_STEP_SHARE_MAX * STEP_WINDOW):
            return _end(s)
    return None


def _first_low_active_at(held: list[StepRecord]) -> float | None:
    """When active / slots held had been under its line for SUSTAIN_STEPS steps."""
    below = 0
    for s in held:
        below = below + 1 if s.num_active < ACTIVE_RATIO_MIN * s.slots_held else 0
        if below == SUSTAIN_STEPS:
            return _end(s)
    return None


def _first_low_slot_util_at(held: list[StepRecord]) -> float | None:
    """When slot utilisation since the start (useful tokens / slots held, so far) had
    been under its line for SUSTAIN_STEPS steps."""
    active = slots = below = 0
    for s in held:
        active += s.num_active
        slots += s.slots_held
        below = below + 1 if active < SLOT_UTILIZATION_MIN * slots else 0
        if below == SUSTAIN_STEPS:
            return _end(s)
    return None


def _end(s: StepRecord) -> float:
    return s.start_s + s.duration_s


def alert_times(ms: Sequence[RequestLatencies], steps: Steps) -> RunSummary:
    """The alert_*_at_s fields of a run with step records (nothing without them)."""
    replicas = per_replica(steps)
    recs = sorted((s for r in replicas for s in r), key=_end)
    if not recs:
        return RunSummary()
    t0 = min([s.start_s for s in recs] + [m.arrival_time for m in ms])
    held = [s for s in recs if s.slots_held > 0]

    def since(t: float | None) -> float | None:
        return None if t is None else t - t0

    return RunSummary.of(
        alert_queue_at_s=since(_first_queue_at(replicas)),
        alert_ttft_p99_at_s=since(_first_ttft_p99_at(ms)),
        alert_prefill_share_at_s=since(_first_prefill_share_at(recs)),
        alert_low_active_at_s=since(_first_low_active_at(held)),
        alert_low_slot_util_at_s=since(_first_low_slot_util_at(held)))


def _secs(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def lead(s: RunSummary, early: object, early_text: tuple[str, str], late: object,
         late_text: tuple[str, str], reported: str) -> str:
    """How far the early signal ran ahead of the late alert in this run, e.g. "in this
    run the waiting queue reached 10 at t=81 s, 143 s before TTFT P99 passed 5 s", then
    what the incident reported, labelled as such. `early` and `late` are RunSummary
    fields (S.NAME); each text is (subject, what it did), e.g. ("TTFT P99", "passed 5 s")."""
    e_name, l_name = field_name(early), field_name(late)
    (e_who, e_did), (l_who, l_did) = early_text, late_text
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
