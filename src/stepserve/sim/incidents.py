"""The incidents' own figures, and where a run of each scenario shows them.

Each incident reports figures (the promo spike's TTFT P99 of 9.4 s, the night report's
420 tok/s ...). A `Figure` is one of them: its value in the incident, and how a run of the
scenario reads it (a RunSummary field, a request class's summary, the batching
comparison, the cost model). Its scenario reproduces it within `TOLERANCE`, unless
`why_not` says why it cannot hold together with the incident's other figures (the
arithmetic is there). `format_figures` prints them after the table; docs/guide.md tells
the story and tests/sim/test_incident_figures.py pins them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.cost import CostModel
from stepserve.sim.run import RunResult, SimulateResult
from stepserve.sim.scenarios import get_scenario

TOLERANCE = 0.25

# The promo spike's TTFT is measured at its gateway: the daily traffic's mean 0.95 s and
# P99 1.1 s sit ~0.9 s above what an engine with no queue takes for these prompts (~0.05
# s), and so close together that no queue can be in them. The lab adds those 0.9 s
# (retrieval and the gateway, before the engine) to the engine's TTFT and E2E.
GATEWAY_S = 0.9
# The incident gives no timeout. A promo client here gives up when its first token
# comes later than twice the daily mean TTFT (2 x 0.95 s at the gateway): the daily
# traffic (P99 1.1 s) misses that about as rarely as the incident's 0.5%. The share is
# sensitive to it (docs/guide.md: 2 s gives 8.7%, 1.5 s 19.7%).
DEADLINE_S = 2 * 0.95

Read = Callable[[SimulateResult], "float | None"]


@dataclass(frozen=True)
class Figure:
    name: str
    document: float  # the incident's figure
    unit: str  # "s", "ms", "%", "x", "tok/s", "/min", ""
    read: Read
    after: bool = False  # a figure of the fix (or of the time before the incident)
    why_not: str = ""  # set: it cannot hold together with the others, and why

    @property
    def holds(self) -> bool:
        return not self.why_not

    def measure(self, result: SimulateResult) -> float | None:
        try:
            return self.read(result)
        except (KeyError, TypeError, ZeroDivisionError):  # a run or class left out
            return None

    def error(self, result: SimulateResult) -> float | None:
        value = self.measure(result)
        return None if value is None else (value - self.document) / self.document


def run_of(result: SimulateResult, name: str) -> RunResult:
    for run in result.runs:
        if run.name == name:
            return run
    raise KeyError(name)


def summary_field(run: str, name: str, plus: float = 0.0, klass: str | None = None) -> Read:
    """A summary field of `run` (of its request class `klass`), plus `plus`."""
    def read(result: SimulateResult) -> float | None:
        r = run_of(result, run)
        summary: RunSummary = r.by_class[klass] if klass else r.summary  # type: ignore[index]
        value = getattr(summary, name)
        return None if value is None else value + plus
    return read


def prefill_step_s(cost: CostModel, tokens: int) -> float:
    """One step that prefills a `tokens`-token prompt from its start, alone."""
    req = Request("probe", [1] * tokens, SamplingParams(max_tokens=1), 0.0)
    return cost.step_time(SchedulerOutput(0, [req], [tokens], num_prefill_tokens=tokens))


def late_timeouts(result: SimulateResult, run: str = "before") -> float | None:
    """Share of the promo's requests whose first token came after the client's deadline
    at the gateway (the TTFT samples: every completed request's, thinned evenly)."""
    samples = run_of(result, run).latency_samples
    if samples is None or not samples.ttft_s:
        return None
    limit = DEADLINE_S - GATEWAY_S
    return sum(1 for t in samples.ttft_s if t > limit) / len(samples.ttft_s)


def _comparison(name: str) -> Read:
    return lambda result: getattr(result.comparison, name)


NIGHT_REPORT = (
    Figure("throughput, static batching (64 slots)", 420, "tok/s",
           summary_field("static", "throughput_tokens_per_s")),
    Figure("slot utilisation, static", 0.165, "%", summary_field("static", "slot_utilization")),
    Figure("E2E P99, static", 52, "s", summary_field("static", "e2e_p99_s")),
    Figure("sequences still running after step 20 (of 64)", 10, "",
           lambda r: run_of(r, "static").summary.active_ratio_p50 * 64),
    Figure("speedup cap", 6.1, "x", _comparison("speedup_cap")),
    Figure("continuous / static, measured", 4.9, "x", _comparison("speedup"), after=True),
)

MIXED_POOL = (
    Figure("chat TTFT P99", 6.9, "s", summary_field("before", "ttft_p99_s", klass="chat")),
    Figure("TPOT P50", 0.058, "ms", summary_field("before", "tpot_p50_s")),
    Figure("the TPOT spike: one prefill step (the longest)", 6.8, "s",
           summary_field("before", "step_max_s")),
    Figure("summaries' TTFT (P50)", 1.9, "s", summary_field("before", "ttft_p50_s", klass="summary")),
    Figure("the TPOT spike read as ITL max", 6.8, "s", summary_field("before", "itl_max_s"),
           why_not="a backlog of summaries runs prompt-only steps back to back under "
                   "prefill_first, so a token can wait out several of them; the incident "
                   "counts one"),
    Figure("engine waiting queue, max", 31, "", summary_field("before", "waiting_max"),
           why_not="31 waiting with none older than 6.4 s takes >= 31 / 6.4 = 4.8 req/s; "
                   "at 30% 8K summaries that is 12K prompt tokens/s of summaries alone, "
                   "2.4x the ~5K/s a 2,048-token chunk in 0.4 s allows"),
    Figure("steps that are prefill only", 0.90, "%", summary_field("before", "prefill_step_share"),
           why_not="with 90% of steps prompt-only (~7 s each) a token would wait ~9 steps: "
                   "TPOT P50 could not stay 58 ms"),
    Figure("chat TTFT P99 (before the incident)", 1.1, "s",
           summary_field("after", "ttft_p99_s", klass="chat"), after=True),
    Figure("summaries' TTFT P50 (before the incident)", 2.4, "s",
           summary_field("after", "ttft_p50_s", klass="summary"), after=True),
    Figure("the longest step after the fix", 0.4, "s", summary_field("after", "step_max_s"),
           after=True,
           why_not="the 2,048 cap is per request: a summary's chunk and the chats that "
                   "arrived with it share a step of up to 8,192 tokens"),
)

PROMO_SPIKE = (
    Figure("mean TTFT (gateway)", 1.25, "s", summary_field("before", "ttft_mean_s", GATEWAY_S)),
    Figure("TTFT P99 (gateway)", 9.4, "s", summary_field("before", "ttft_p99_s", GATEWAY_S)),
    Figure("E2E P99 (gateway)", 47, "s", summary_field("before", "e2e_p99_s", GATEWAY_S)),
    Figure("requests in flight at the peak", 140, "", summary_field("before", "in_engine_max")),
    Figure("waiting queue, max", 38, "", summary_field("before", "waiting_max")),
    Figure(f"timeouts (first token over {DEADLINE_S:g} s)", 0.12, "%", late_timeouts),
    Figure("preemptions per minute", 11, "/min",
           lambda r: run_of(r, "before").summary.preemptions
           / (run_of(r, "before").summary.duration_s / 60),
           why_not="140 in flight over 2 replicas of 38 GB (193K tokens at 192 KiB) fill "
                   "the KV only at 2,760 tokens a sequence, i.e. ~2,400-token prompts; "
                   "prefilling those at 980/min takes ~580 TFLOP/s a replica, more than "
                   "an H100 reaches (~495), and the latencies above could not hold"),
    Figure("share of preemptions on outputs over 1,200", 0.78, "%",
           summary_field("before", "preemptions_on_long_share"), why_not="no preemptions: above"),
)

FIGURES: dict[str, tuple[Figure, ...]] = {
    "night-report": NIGHT_REPORT, "mixed-pool": MIXED_POOL, "promo-spike": PROMO_SPIKE}
COST_FIGURES: dict[str, tuple[tuple[str, float, int], ...]] = {
    # (what, the incident's seconds, prompt tokens): a lone prefill step on the cost model
    "mixed-pool": (("a 300-token prefill", 0.07, 300),
                   ("a 2,048-token chunk (the fix's cap)", 0.4, 2048)),
}


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "%":
        return f"{v:.1%}"
    if unit in ("ms", "s") and v < 1:
        return f"{v * 1e3:.0f} ms"
    if unit in ("s", "x"):
        text = f"{v:.2f}" if v < 10 else f"{v:.1f}"
        return f"{text} s" if unit == "s" else f"{text}x"
    text = f"{v:,.0f}" if v >= 100 or float(v).is_integer() else f"{v:,.1f}"
    return f"{text} {unit}".strip()


def _row(name: str, document: str, lab: str, error: float | None, note: str) -> str:
    err = "-" if error is None else f"{error:+.0%}"
    return f"  {name:<48} {document:>10} {lab:>10} {err:>6}  {note}"


def own_cost(result: SimulateResult) -> CostModel | None:
    """The scenario's own cost model, if the run used it (not one given by --cost)."""
    try:
        cost = get_scenario(result.scenario).cost_model()
    except ValueError:
        return None
    return cost if cost.describe() == result.cost_model else None


def format_figures(result: SimulateResult) -> list[str]:
    """The incident's figures against this run (nothing for other scenarios); the ones
    that are one step's time come from the scenario's cost model, when the run used it."""
    figures = FIGURES.get(result.scenario, ())
    if not figures:
        return []
    cost = own_cost(result)
    lines = [f"the incident's figures (document, this run, error; within "
             f"{TOLERANCE:.0%} unless a note says why not):"]
    for after in (False, True):
        rows = [f for f in figures if f.after == after]
        if rows:
            lines.append("  after" if after else "  before")
        for f in rows:
            error = f.error(result)
            note = f"cannot hold: {f.why_not}" if f.why_not else (
                "" if error is None or abs(error) <= TOLERANCE else "OUTSIDE the tolerance")
            lines.append(_row(f.name, _value(f.document, f.unit),
                              _value(f.measure(result), f.unit), error, note))
    for what, seconds, tokens in COST_FIGURES.get(result.scenario, ()) if cost else ():
        lab = prefill_step_s(cost, tokens)
        lines.append(_row(what, _value(seconds, "s"), _value(lab, "s"),
                          (lab - seconds) / seconds, "the cost model, one step alone"))
    return lines
