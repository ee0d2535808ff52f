"""Plain-text tables of simulated (or measured) runs, side by side, one row a metric,
each row with a one-line note on what it means. A row reads a RunSummary's fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from stepserve.metrics.rules import Finding
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.incident_verdicts import format_verdict
from stepserve.sim.incidents import format_figures
from stepserve.sim.run import RunResult, SimulateResult


def fmt_s(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:,.0f} ms" if v < 10 else f"{v:,.1f} s"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _count(v: Any) -> str:
    return "-" if v is None else str(v)


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:,.2f}"


Row = tuple[str, Callable[[RunSummary], str], str]

ROWS: list[Row] = [
    ("requests done/429/timeout", lambda s: f"{_count(s.requests_finished)}/"
     f"{_count(s.requests_rejected)}/{_count(s.requests_timed_out)}",
     "finished / rejected (queue full or too long) / timed out"),
    ("throughput (tok/s)", lambda s: _num(s.throughput_tokens_per_s),
     "output tokens per second of (virtual) time"),
    ("TTFT P50 / P99", lambda s: f"{fmt_s(s.ttft_p50_s)} / {fmt_s(s.ttft_p99_s)}",
     "arrival to first token: queueing + prefill"),
    ("TPOT P50 / P99", lambda s: f"{fmt_s(s.tpot_p50_s)} / {fmt_s(s.tpot_p99_s)}",
     "(E2E - TTFT) / (output - 1): the pace of generation"),
    ("ITL P99 / max", lambda s: f"{fmt_s(s.itl_p99_s)} / {fmt_s(s.itl_max_s)}",
     "gap between two tokens of one request: a prefill-only step shows up here as a spike"),
    ("E2E P50 / P99", lambda s: f"{fmt_s(s.e2e_p50_s)} / {fmt_s(s.e2e_p99_s)}",
     "arrival to last token"),
    ("preemptions (on long)",
     lambda s: f"{_count(s.preemptions)} ({_pct(s.preemptions_on_long_share)})",
     "evictions when KV ran out; share that hit requests over 1,200 output tokens"),
    ("slot utilisation", lambda s: _pct(s.slot_utilization),
     "useful tokens / (slots held x steps); static batching's idle slots show here"),
    ("active / concurrency P50", lambda s: _pct(s.active_ratio_p50),
     "sequences producing a token / slots held, median step; seed alert < 30%"),
    ("prefill-only steps", lambda s: _pct(s.prefill_step_share),
     "steps with prefill and no decode; seed alert > 70%"),
    ("zero-decode steps", lambda s: _pct(s.zero_decode_step_share),
     "steps where sequences ready to decode got 0 tokens; seed alert > 10%"),
    ("waiting queue max", lambda s: _num(s.waiting_max), "longest waiting queue seen"),
    ("KV usage max", lambda s: _pct(s.kv_usage_max), "share of KV blocks in use, peak"),
    ("prefix cache hit / repeated",
     lambda s: f"{_pct(s.prefix_cache_hit_rate)} / {_pct(s.prefix_repeated_share)}",
     "prompt tokens served from the prefix cache / that an earlier prompt began with"),
]


class NamedRun(Protocol):
    """A column of a table: a run's name and its summary."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> RunSummary: ...


def format_runs(runs: Sequence[NamedRun], rows: list[Row] = ROWS) -> str:
    names = [r.name for r in runs]
    cells = [[fmt(r.summary) for r in runs] for _, fmt, _ in rows]
    w0 = max(len(label) for label, _, _ in rows)
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["  ".join([" " * w0] + [n.rjust(w) for n, w in zip(names, widths)])]
    for (label, _, note), row in zip(rows, cells):
        lines.append("  ".join([label.ljust(w0)] + [c.rjust(w) for c, w in zip(row, widths)])
                     + f"   {note}")
    return "\n".join(lines)


def format_by_class(runs: Sequence[RunResult]) -> str:
    lines = []
    for run in runs:
        for cls, s in (run.by_class or {}).items():
            lines.append(f"  {run.name:>10} {cls:>10}: TTFT P50 {fmt_s(s.ttft_p50_s)}, "
                         f"P99 {fmt_s(s.ttft_p99_s)}; TPOT P99 {fmt_s(s.tpot_p99_s)}; "
                         f"E2E P99 {fmt_s(s.e2e_p99_s)}; preemptions {_count(s.preemptions)}")
    return "\n".join(lines)


def format_deployment(d: dict) -> str:
    """A run's pools and rules (RunResult.deployment) on one line."""
    pools = ", ".join(f"{name} x{n}" for name, n in d.get("pools", {}).items())
    rules = "; ".join(d.get("rules", []))
    return f"pools {pools} ({d.get('router')}); " + (
        f"{rules}; else {d.get('default')}" if rules else "no rules")


def format_findings(findings: Sequence[Finding]) -> str:
    if not findings:
        return "doctor: no rule fired."
    lines = ["doctor (the alert rules):"]
    for f in findings:
        lines.append(f"  [{f.severity}] {f.run}: {f.rule}: {f.evidence}")
        lines.append(f"      -> {f.action}")
    return "\n".join(lines)


def format_comparison(result: SimulateResult) -> list[str]:
    """Continuous over static against its cap, and where the rest went: the step count
    (prefill steps, the drain at the end) and the step time (the scheduling overhead a
    full batch pays every step, named in the cost model)."""
    comp = result.comparison
    assert comp is not None
    lines = [f"continuous / static throughput: {comp.speedup:.2f}x; speedup cap for the same "
             f"requests: {comp.speedup_cap:.2f}x ({comp.share_of_cap * 100:.0f}% of the cap "
             "reached)"]
    by_mode = {r.batching: r.summary for r in result.runs}
    static, cont = by_mode.get("static"), by_mode.get("continuous")
    if static is None or cont is None or not (static.steps and cont.steps and
                                              static.mean_step_s and cont.mean_step_s):
        return lines
    by_steps = static.steps / cont.steps
    by_time = static.mean_step_s / cont.mean_step_s
    lines += [
        f"  by step count: {static.steps:,.0f} static / {cont.steps:,.0f} continuous steps = "
        f"{by_steps:.2f}x ({by_steps / comp.speedup_cap:.0%} of the cap: prefill steps and "
        "the drain at the end)",
        f"  by step time: {static.mean_step_s * 1e3:.1f} ms static / "
        f"{cont.mean_step_s * 1e3:.1f} ms "
        f"continuous mean step = x{by_time:.2f} (re-forming a full batch every step: the "
        "cost model's scheduling overhead)"]
    return lines


def format_result(result: SimulateResult) -> str:
    parts = [f"scenario: {result.scenario}", f"  {result.description}",
             f"  cost model: {result.cost_model}",
             f"  workload: {result.workload.requests} requests"]
    parts += [f"  {run.name}: {format_deployment(run.deployment)}" for run in result.runs
              if run.deployment]
    parts += ["", format_runs(result.runs)]
    by_class = format_by_class(result.runs)
    if by_class:
        parts += ["", "by request class:", by_class]
    if result.comparison:
        parts += ["", *format_comparison(result)]
    for block in (format_figures(result), format_verdict(result)):
        if block:
            parts += ["", *block]
    parts += ["", format_findings(result.findings)]
    return "\n".join(parts)
