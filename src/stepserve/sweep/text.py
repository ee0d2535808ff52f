"""The sweep's text report, printed by `stepserve sweep` and embedded in the HTML one: the
window each point was measured over, then per series each point's throughput and tail
with their changes, the knee, the last point meeting the SLOs and the recommendation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepserve.sweep.knee import LOAD_AXES, KneeResult, group_series, is_ordered
from stepserve.sweep.points import MIN_SPAN_S, agreement
from stepserve.sweep.spec import format_x
from stepserve.sweep.window import SETTLED_LIFETIMES

if TYPE_CHECKING:
    from stepserve.sweep.result import SweepPointResult, SweepResult

# every tail a point reports, besides the knee's own metric (shown with its rise)
LATENCY_COLUMNS = ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "itl_p99_s", "e2e_p99_s")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _share(v: float | None) -> str:
    """A share of a whole (the prefix cache's hit rate), unsigned."""
    return "-" if v is None else f"{v:.1%}"


def window_lines(result: SweepResult) -> list[str]:
    """Which span of each point the numbers below measure, and the points whose span was
    the whole run (*) or too short to settle (~)."""
    rule = result.window
    if rule is not None:
        text = rule.describe()
    elif result.target != "sim":
        text = ("each point's whole run against the live server, after its --warmup "
                "requests")
    else:
        text = "each point's whole run (a result written before steady windows)"
    lines = [f"measured over {text}"]
    windows = [(r.name, r.window) for r in result.runs if r.window is not None]
    whole = [name for name, w in windows if not w.steady]
    if whole and rule is not None and rule.kind == "steady":
        lines.append(f"  * whole run, no steady window: {', '.join(whole)}")
    short = [(name, w) for name, w in windows if not w.settled]
    if short:
        keep = 1 - (rule.warmup_share if rule else 0.0)
        need = max(SETTLED_LIFETIMES * (w.lifetime_s or 0.0) / keep for _, w in short)
        lines.append(f"  ~ window shorter than {SETTLED_LIFETIMES:g} request lifetimes (the "
                     f"batch still filling): {', '.join(n for n, _ in short)}; run each "
                     f"point longer, e.g. --duration-s {max(need, MIN_SPAN_S):.0f}")
    return lines


def format_knees(result: SweepResult) -> str:
    rule = result.knee_rule
    metric = rule.p99_metric
    others = [c for c in LATENCY_COLUMNS if c != metric]
    lines = [f"knee rule: throughput gain < {rule.min_throughput_gain:.0%} while "
             f"{metric} rises > {rule.max_p99_rise:.0%} (vs the previous point); the knee "
             f"is the last point before the steepest {metric} jump into it; gains within "
             f"{rule.noise_margin:.0%} are noise", *window_lines(result)]
    by_series = group_series(result.runs)
    for knee in result.knees:
        group = by_series[knee.series]
        lines.append(f"\n{result.x_axis} sweep, series {knee.series}:")
        lines.append(f"  {'x':>10} {'tok/s':>7} {'gain':>8} {metric:>11} {'rise':>9} "
                     + " ".join(f"{_short(c):>9}" for c in others)
                     + f" {'preempt':>7} {'hit':>6}  slo")
        for i, run in enumerate(group):
            lines.append(_row(run, knee, i, metric, others))
        lines += _verdict(result, knee, metric)
    both = agreement(result.knees)
    if both:
        lines += ["", both]
    return "\n".join(lines)


def _short(metric: str) -> str:
    """`tpot_p99_s` -> `tpot_p99`: the column heads."""
    return metric.removesuffix("_s")


def _row(run: SweepPointResult, knee: KneeResult, i: int, metric: str,
         others: list[str]) -> str:
    s = run.summary
    step = knee.steps[i - 1] if i else None
    marks = [name for name, at in (("knee", knee.knee_index), ("P99 cliff", knee.cliff_index),
                                   ("throughput flat", knee.saturated_index),
                                   ("throughput flat", knee.flat_index),
                                   ("recommended", knee.recommended_index)) if at == i]
    w = run.window
    whole = "" if w is None else "*" if not w.steady else "" if w.settled else "~"
    return (f"  {format_x(run.sweep.x) + whole:>10} {_count(s.throughput_tokens_per_s):>7} "
            f"{_pct(step.throughput_gain if step else None):>8} "
            f"{_num(s.metric(metric)):>11} {_pct(step.p99_rise if step else None):>9} "
            + " ".join(f"{_num(s.metric(c)):>9}" for c in others)
            + f" {_count(s.preemptions):>7} {_share(s.prefix_cache_hit_rate):>6}"
            + f"  {'ok' if knee.slo_met[i] else 'miss'}"
            + "".join(f" <- {m}" for m in marks))


def _verdict(result: SweepResult, knee: KneeResult, metric: str) -> list[str]:
    """The knee (or why none), the last point meeting the SLOs, the recommendation."""
    lines = []
    x = result.x_axis
    if knee.knee_index is None:
        i = knee.flat_index
        hint = (f" (throughput flat from {x}={format_x(knee.xs[i])}, but {metric} changed only "
                f"{_pct(knee.steps[i - 1].p99_rise)} there; try another --p99-metric or "
                "--max-p99-rise)") if i is not None else ""
        lines.append(f"  knee: none in this range{hint}")
    else:
        cliff, sat = knee.cliff_index, knee.saturated_index
        assert cliff is not None and sat is not None
        lines.append(f"  knee: {x}={format_x(knee.knee_x)}: the last point before {metric} jumps "
                     f"{_pct(knee.cliff_p99_rise)} at {x}={format_x(knee.xs[cliff])}; throughput "
                     f"{_pct(knee.throughput_gain)} (flat) at {x}={format_x(knee.xs[sat])}")
    if result.knee_rule.slos:
        slo_text = " and ".join(s.describe() for s in result.knee_rule.slos)
        lines.append(f"  {_meeting(x, knee)} {slo_text}: {_met(x, knee)}")
    rec = knee.recommended_index
    lines.append(f"  recommended: {'none' if rec is None else format_x(knee.xs[rec])} "
                 f"({knee.reason})")
    return lines


def _meeting(x_axis: str, knee: KneeResult) -> str:
    """The SLO line's words for what varied: a load, a setting, or runs without order."""
    if x_axis in LOAD_AXES:
        return "highest load meeting"
    if is_ordered(knee.xs, x_axis):
        return f"highest {x_axis} meeting"
    return "points meeting"


def _met(x_axis: str, knee: KneeResult) -> str:
    if is_ordered(knee.xs, x_axis):
        best = knee.best_slo_index
        return "none" if best is None else format_x(knee.xs[best])
    return ", ".join(format_x(v) for v, ok in zip(knee.xs, knee.slo_met) if ok) or "none"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
