"""The sweep's text report: per series, each point's throughput and tail with their
changes, the knee (or why there is none), the highest load meeting the SLOs and the
recommendation. Printed by `stepserve sweep` and embedded in the HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepserve.sweep.knee import KneeResult, group_series
from stepserve.sweep.predict import agreement

if TYPE_CHECKING:
    from stepserve.sweep.result import SweepResult


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def format_knees(result: SweepResult) -> str:
    rule = result.knee_rule
    metric = rule.p99_metric
    other = "e2e_p99_s" if metric == "ttft_p99_s" else "ttft_p99_s"
    lines = [f"knee rule: throughput gain < {rule.min_throughput_gain:.0%} while "
             f"{metric} rises > {rule.max_p99_rise:.0%} (vs the previous point)"]
    by_series = group_series(result.runs)
    for knee in result.knees:
        group = by_series[knee.series]
        lines.append(f"\n{result.x_axis} sweep, series {knee.series}:")
        lines.append(f"  {'x':>10} {'tok/s':>9} {'gain':>8} {metric:>12} {'rise':>8} "
                     f"{other:>10} {'preempt':>7}  slo")
        for i, run in enumerate(group):
            s = run.summary
            step = knee.steps[i - 1] if i else None
            mark = " <- knee" if i == knee.knee_index else ""
            mark += " <- throughput flat" if i == knee.flat_index else ""
            mark += " <- recommended" if i == knee.recommended_index else ""
            p99 = s.metric(metric)
            lines.append(
                f"  {_x(run.sweep.x):>10} {_count(s.throughput_tokens_per_s):>9} "
                f"{_pct(step.throughput_gain if step else None):>8} "
                f"{'-' if p99 is None else f'{p99:.2f}':>12} "
                f"{_pct(step.p99_rise if step else None):>8} "
                f"{_num(s.metric(other)):>10} {_count(s.preemptions):>7}  "
                f"{'ok' if knee.slo_met[i] else 'miss'}{mark}")
        lines += _verdict(result, knee, metric)
    both = agreement(result.knees)
    if both:
        lines += ["", both]
    return "\n".join(lines)


def _verdict(result: SweepResult, knee: KneeResult, metric: str) -> list[str]:
    """The knee (or why none), the highest load meeting the SLOs, the recommendation."""
    lines = []
    if knee.knee_index is None:
        i = knee.flat_index
        hint = (f" (throughput flat from {result.x_axis}={_x(knee.xs[i])}, but "
                f"{metric} changed only {_pct(knee.steps[i - 1].p99_rise)} there; "
                "try another --p99-metric or --max-p99-rise)") if i is not None else ""
        lines.append(f"  knee: none in this range{hint}")
    else:
        lines.append(f"  knee: {result.x_axis}={_x(knee.knee_x)}: throughput "
                     f"{_pct(knee.throughput_gain)}, {metric} {_pct(knee.p99_rise)}")
    if result.knee_rule.slos:
        best = knee.best_slo_index
        slo_text = " and ".join(s.describe() for s in result.knee_rule.slos)
        lines.append(f"  highest load meeting {slo_text}: "
                     f"{'none' if best is None else _x(knee.xs[best])}")
    rec = knee.recommended_index
    lines.append(f"  recommended: {'none' if rec is None else _x(knee.xs[rec])} "
                 f"({knee.reason})")
    return lines


def _x(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
