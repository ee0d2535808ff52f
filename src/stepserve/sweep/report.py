"""`stepserve report RESULT.json --out DIR`: PNG plots and one self-contained HTML page
(PNGs embedded as base64, also written beside it) for a sweep, simulate or bench result,
or a `vllm bench serve --save-result` file. Runs without `timeseries` or
`latency_samples` (metrics.summary.measure_run) are skipped with a note on the page. A
file whose runs hold values `stepserve doctor` refuses (a string, a NaN, a 1e30) is
refused with the doctor's line before anything is drawn (metrics.result_runs).

The plots are drawn with matplotlib's Agg backend (loaded only to draw; no pyplot, no
global state). Lines that would hide one another (the same data) are told apart by
marker, dash and width, and the legend says which equals which. knee.png, on an ordered
axis (a load, a numeric setting): one line per series, the knee a red X, the
recommendation a green star, the last point meeting the SLOs a blue diamond, each SLO a
dashed line; a tail spanning over two decades on a log scale. On a named axis (runs,
policies, seeds) points side by side, not joined: a line would invent an order. No
sweep: bars per run from zero (nearly equal throughputs would otherwise fill the axis).

The text report, printed by `stepserve sweep` and embedded in the page: the window each
point was measured over, then per series each point's throughput and tail with their
changes, the knee, the last point meeting the SLOs and the recommendation.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepserve.bench.results import BenchResult, BenchRun, bench_result_from_vllm
from stepserve.config.errors import UsageError
from stepserve.config.user_files import check_output_dir, load_json, write_atomic
from stepserve.metrics.result_runs import result_runs
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples
from stepserve.metrics.vllm_summary import is_vllm_result
from stepserve.sim.run import RunResult, SimulateResult
from stepserve.sweep.knee import LOAD_AXES, P99_METRIC, KneeResult, group_series, is_ordered
from stepserve.sweep.points import MIN_SPAN_S, agreement
from stepserve.sweep.result import KIND, SweepPointResult, SweepResult
from stepserve.sweep.spec import SummarySLO, format_x
from stepserve.sweep.window import SETTLED_LIFETIMES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ReportResult = SimulateResult | SweepResult | BenchResult
PlotRun = RunResult | SweepPointResult | BenchRun  # what a line of a plot is drawn from


@dataclass(frozen=True)
class Group:
    name: str
    labels: list[str]  # one per run, the line label
    runs: list[PlotRun]


def panels(n_panels: int, cols: int = 1, width: float = 7.5) -> tuple[Figure, list]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # only when a report is drawn
    from matplotlib.figure import Figure

    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def label_axes(ax: Any, title: str, xlabel: str, ylabel: str, **legend: Any) -> None:
    """A panel's title, axis labels, light grid and small legend, as every plot has them."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, **legend)


MARKERS = ("o", "s", "^", "v", "<", ">", "p", "h")
DASHES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class Style:
    """How one series is drawn: equal data drawn equally would hide one another, so each
    series gets its own colour, marker and dash, and earlier ones a wider line."""

    color: Any
    marker: str
    ls: str
    lw: float

    def kwargs(self, markers: bool = True) -> dict[str, Any]:
        out = {"color": self.color, "ls": self.ls, "lw": self.lw}
        if markers:
            out.update(marker=self.marker, markevery=_MARK_EVERY, ms=5)
        return out


_MARK_EVERY = 0.1  # a marker every tenth of the line's length: visible, not a smear


def styles(n: int) -> list[Style]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [Style(color, MARKERS[i % len(MARKERS)], DASHES[i % len(DASHES)],
                  1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1))
            for i, color in enumerate(cmap(0.9 * i / max(n - 1, 1)) for i in range(n))]


def distinct_labels(labels: list[str], data: list[Any]) -> list[str]:
    """`labels`, each whose data equals an earlier one's marked "(same as X)": drawn on
    top of each other, the legend is what tells them apart."""
    out = []
    for i, (label, values) in enumerate(zip(labels, data)):
        twin = next((labels[j] for j in range(i) if data[j] == values), None)
        out.append(label if twin is None else f"{label} (same as {twin})")
    return out


DPI = 90  # the PNGs' resolution


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    return path


def _draw(ax: Any, g: Group, lines: list[tuple[list, list]], **plot: Any) -> None:
    """One line (xs, ys) per run of `g`, those of equal data told apart; none drawn for
    a run without values."""
    for style, label, (xs, ys) in zip(styles(len(g.runs)), distinct_labels(g.labels, lines), lines):
        if xs:
            ax.plot(xs, ys, label=label, **plot, **style.kwargs())


def latency_cdf(groups: list[Group], samples: Callable[[LatencySamples], list[float]],
                title: str, limits: Sequence[tuple[float, str]] = ()) -> Figure:
    """Empirical CDF of some latency samples (seconds), one line per run; `limits` (an
    SLO's value and label) as vertical lines: a curve meets a P99 limit where it crosses
    the 0.99 line left of it. Samples spanning over two decades get a log axis (an
    overloaded point's minutes would squash the others into the first pixels)."""
    fig, axes = panels(len(groups))
    for ax, g in zip(axes, groups):
        data = []
        for run in g.runs:
            assert run.latency_samples is not None, "groups hold runs with samples"
            data.append(sorted(samples(run.latency_samples)))
        _draw(ax, g, [(xs, [(i + 1) / len(xs) for i in range(len(xs))]) for xs in data],
              drawstyle="steps-post")
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        for value, label in limits:
            ax.axvline(value, color="crimson", ls="--", lw=1.2, label=label)
        seen = [v for xs in data for v in xs] + [v for v, _ in limits]
        if seen and min(seen) > 0 and max(seen) / min(seen) > 100:
            ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        label_axes(ax, f"{title}: {g.name}", "seconds", "share of requests", loc="lower right")
    return fig


def _series(run: PlotRun) -> TimeSeries:
    assert run.timeseries is not None, "groups hold runs with a time series"
    return run.timeseries


def timeseries_plot(groups: list[Group], series: Callable[[TimeSeries], list[float]],
                    what: str, ylabel: str, title: str, cumulative: bool = False) -> Figure:
    """One series of the runs' time series (`what` names it) over time, one line per run
    (cumulative sums optional)."""
    fig, axes = panels(len(groups))
    for ax, g in zip(axes, groups):
        lines = []
        for run in g.runs:
            ts = _series(run)
            ys = list(itertools.accumulate(series(ts)) if cumulative else series(ts))
            lines.append((list(ts.t), ys))
        _draw(ax, g, lines)
        if all(not any(series(_series(r))) for r in g.runs):
            ax.set_ylim(-0.5, 1)
            ax.text(0.5, 0.5, f"no {what} in any run", transform=ax.transAxes,
                    ha="center", color="grey")
        label_axes(ax, f"{title}: {g.name}", "time (s)", ylabel)
    return fig


def tokens_per_step_plot(groups: list[Group]) -> Figure:
    """Mean prefill and decode tokens per step in each time bin (tokens per second
    when the JSON has no per-bin step counts)."""
    fig, axes = panels(2 * len(groups), cols=2, width=11)
    kinds: tuple[tuple[str, Callable[[TimeSeries], list[float]]], ...] = (
        ("prefill", lambda ts: ts.prefill_tokens), ("decode", lambda ts: ts.decode_tokens))
    for i, g in enumerate(groups):
        for j, (kind, tokens) in enumerate(kinds):
            ax = axes[2 * i + j]
            unit = "tokens / step"
            lines = []
            for run in g.runs:
                ts = _series(run)
                if ts.steps:
                    pts = [(t, v / n) for t, v, n in zip(ts.t, tokens(ts), ts.steps) if n]
                else:
                    unit = "tokens / s"
                    width = (ts.t[1] - ts.t[0]) if len(ts.t) > 1 else 1.0
                    pts = [(t, v / width) for t, v in zip(ts.t, tokens(ts))]
                lines.append(([p[0] for p in pts], [p[1] for p in pts]))
            _draw(ax, g, lines)
            label_axes(ax, f"{kind} {unit}: {g.name}", "time (s)", unit)
    return fig


THROUGHPUT = "throughput_tokens_per_s"
LOG_SPAN = 100.0  # a tail whose max / min exceeds this is drawn on a log scale


@dataclass(frozen=True)
class KneeSeries:
    """One line of the knee plot: throughput and P99 per x, the marked points' indices."""

    name: str
    xs: list[Any]
    throughput: list[float | None]
    p99: list[float | None]
    knee_index: int | None = None
    recommended_index: int | None = None
    best_slo_index: int | None = None


def _once(ax, label: str) -> str:
    """A legend label the first time it is used on `ax`, hidden after."""
    seen = ax.get_legend_handles_labels()[1]
    return "_nolegend_" if label in seen else label


def _positions(series: list[KneeSeries], ordered: bool
               ) -> tuple[list[list[float]], list[str] | None, list[float] | None]:
    """Each series' x positions, and on a named axis the tick labels and their places
    (every name once, in first-seen order; series side by side around each)."""
    if ordered:
        return [[float(x) for x in s.xs] for s in series], None, None
    names: list[str] = []
    for s in series:
        names += [str(x) for x in s.xs if str(x) not in names]
    width = 0.6 / max(len(series), 1)
    out = [[names.index(str(x)) + (k - (len(series) - 1) / 2) * width for x in s.xs]
           for k, s in enumerate(series)]
    return out, names, [float(i) for i in range(len(names))]


def _marks(ax, s: KneeSeries, xs: list[float], ys: list[float | None], k_th: int) -> None:
    """The knee, the last point meeting the SLO and the recommendation of the `k_th`
    series (its knee's label set below the earlier series' ones)."""
    k, r, b = s.knee_index, s.recommended_index, s.best_slo_index
    if k is not None and ys[k] is not None:
        ax.plot([xs[k]], [ys[k]], marker="X", ms=13, color="red", ls="none",
                label=_once(ax, "knee (last point before the P99 cliff)"))
        ax.axvline(xs[k], color="red", ls=":", lw=0.8)
        ax.annotate(f"{s.name} knee @ {format_x(s.xs[k])}", (xs[k], ys[k]),
                    xytext=(6, -12 - 9 * k_th),
                    textcoords="offset points", fontsize=7, color="red")
    if b is not None and ys[b] is not None:
        ax.plot([xs[b]], [ys[b]], marker="D", ms=11, mfc="none", mec="royalblue", mew=1.8,
                ls="none", label=_once(ax, "last point meeting the SLO"))
    if r is not None and ys[r] is not None:
        ax.plot([xs[r]], [ys[r]], marker="*", ms=15, color="green", ls="none",
                label=_once(ax, "recommended"))


def _slo_lines(ax, slos: Sequence[SummarySLO], metric: str) -> None:
    for slo in slos:
        if slo.metric == metric:
            ax.axhline(slo.limit, color="crimson", ls="--", lw=1.2,
                       label=_once(ax, f"SLO {slo.describe()}"))


def _log_if_wide(ax, values: list[float | None], slos: Sequence[SummarySLO], metric: str) -> None:
    shown = [v for v in values if v is not None and v > 0]
    shown += [s.limit for s in slos if s.metric == metric and s.limit > 0]
    if shown and max(shown) / min(shown) > LOG_SPAN:
        ax.set_yscale("log")


def knee_plot(series: list[KneeSeries], x_name: str, p99_metric: str,
              slos: Sequence[SummarySLO] = ()) -> Figure:
    """Throughput and P99 against the swept value, per series (see the module doc)."""
    fig, (ax_t, ax_p) = panels(2)
    ordered = all(is_ordered(s.xs, x_name) for s in series)
    positions, names, ticks = _positions(series, ordered)
    labels = distinct_labels([s.name for s in series],
                             [(s.xs, s.throughput, s.p99) for s in series])
    for k_th, (style, s, xs, label) in enumerate(zip(styles(len(series)), series, positions,
                                                     labels)):
        for ax, ys in ((ax_t, s.throughput), (ax_p, s.p99)):
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            line = style.kwargs(markers=False) if ordered else {"color": style.color, "ls": "none"}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=style.marker, ms=6,
                    label=label, **line)
            _marks(ax, s, xs, ys, k_th)
    _slo_lines(ax_t, slos, THROUGHPUT)
    _slo_lines(ax_p, slos, p99_metric)
    _log_if_wide(ax_p, [v for s in series for v in s.p99], slos, p99_metric)
    for ax, what in ((ax_t, "throughput"), (ax_p, p99_metric)):
        if names is not None:
            ax.set_xticks(ticks, names)
        label_axes(ax, f"{what} vs {x_name}", x_name,
                   "output tokens / s" if ax is ax_t else p99_metric)
    return fig


def runs_plot(names: list[str], throughput: list[float | None], p99: list[float | None],
              p99_metric: str) -> Figure:
    """Per run, not a sweep: bars from zero, each labelled with its value."""
    fig, (ax_t, ax_p) = panels(2)
    colors = [s.color for s in styles(len(names))]
    places = list(range(len(names)))
    for ax, values, title, fmt in ((ax_t, throughput, "throughput per run", "{:,.1f}"),
                                   (ax_p, p99, f"{p99_metric} per run", "{:.3g}")):
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(places, heights, color=colors, width=0.6)
        ax.bar_label(bars, [fmt.format(v) if v is not None else "-" for v in values], fontsize=8)
        ax.set_xticks(places, names)
        ax.set_ylim(0, max(heights + [0.0]) * 1.15 or 1.0)
        ax.set_title(f"{title} (runs side by side: no sweep, no knee)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    ax_t.set_ylabel("output tokens / s")
    ax_p.set_ylabel(p99_metric)
    return fig


SUMMARY_COLUMNS = (
    ("throughput_tokens_per_s", "tok/s", "{:.0f}"),
    ("ttft_p50_s", "TTFT P50", "{:.2f}"), ("ttft_p95_s", "P95", "{:.2f}"),
    ("ttft_p99_s", "P99", "{:.2f}"),
    ("e2e_p50_s", "E2E P50", "{:.2f}"), ("e2e_p95_s", "P95", "{:.2f}"),
    ("e2e_p99_s", "P99", "{:.2f}"),
    ("tpot_p99_s", "TPOT P99", "{:.3f}"), ("preemptions", "preempt", "{}"),
    ("waiting_max", "waiting max", "{}"), ("requests_finished", "done", "{}"),
)


def result_kind(result: ReportResult) -> str:
    """sweep, bench or simulate."""
    if isinstance(result, SweepResult):
        return "sweep"
    return "bench" if isinstance(result, BenchResult) else "simulate"


def _scenario(result: ReportResult) -> str:
    return "" if isinstance(result, BenchResult) else result.scenario


def groups_of(result: ReportResult) -> list[Group]:
    """A panel per sweep series (lines per swept value), or one panel of all runs."""
    runs: list[PlotRun] = list(result.runs)
    if not isinstance(result, SweepResult) or result.x_axis == "run":
        return [Group(_scenario(result) or "runs", [r.name for r in runs], runs)]
    out: dict[str, Group] = {}
    for r in result.runs:
        g = out.setdefault(r.sweep.series, Group(r.sweep.series, [], []))
        g.labels.append(f"{result.x_axis}={format_x(r.sweep.x)}")
        g.runs.append(r)
    return list(out.values())


def _knee_figure(result: ReportResult) -> tuple[str, Figure]:
    """(caption, figure): a sweep's knee plot, or bars per run for any other result."""
    if not isinstance(result, SweepResult):
        runs = result.runs
        fig = runs_plot([r.name for r in runs],
                        [r.summary.throughput_tokens_per_s for r in runs],
                        [r.summary.metric(P99_METRIC) for r in runs], P99_METRIC)
        return (f"Throughput and {P99_METRIC} per run (a {result_kind(result)} result: no "
                "sweep, no knee)"), fig
    rule = result.knee_rule
    slo_text = " and ".join(s.describe() for s in rule.slos)
    caption = (f"Throughput and {rule.p99_metric} against {result.x_axis}; red X: knee "
               "(the last point before the P99 cliff), green star: recommendation"
               + (f", blue diamond: last point meeting {slo_text}, dashed line: the SLO"
                  if rule.slos else ""))
    by_series = group_series(result.runs)
    series = [KneeSeries(k.series, k.xs, [r.summary.throughput_tokens_per_s
                                         for r in by_series[k.series]],
                         [r.summary.metric(rule.p99_metric) for r in by_series[k.series]],
                         k.knee_index, k.recommended_index,
                         k.best_slo_index if rule.slos else None) for k in result.knees]
    return caption, knee_plot(series, result.x_axis, rule.p99_metric, rule.slos)


def _limits(result: ReportResult, latency: str) -> list[tuple[float, str]]:
    """A sweep's SLOs on a percentile of `latency` (ttft, e2e): where its CDF must be."""
    if not isinstance(result, SweepResult):
        return []
    return [(s.limit, f"SLO {s.describe()}") for s in result.knee_rule.slos
            if s.metric.startswith(f"{latency}_p") and not s.at_least]


def _plottable(groups: list[Group], key: str) -> tuple[list[Group], list[str]]:
    """Groups cut to runs that carry `key`, and a note naming runs that do not."""
    kept, missing = [], []
    for g in groups:
        pairs = [(lab, r) for lab, r in zip(g.labels, g.runs) if getattr(r, key) is not None]
        missing += [r.name for r in g.runs if getattr(r, key) is None]
        if pairs:
            kept.append(Group(g.name, [p[0] for p in pairs], [p[1] for p in pairs]))
    notes = [f"no `{key}` in the JSON for: {', '.join(missing)}; those plots are skipped "
             "(write the result with per-run data, see metrics.summary.measure_run)"] \
        if missing else []
    return kept, notes


def write_plots(result: ReportResult, out: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Every plot the data allows: [(caption, png path)], notes."""
    out.mkdir(parents=True, exist_ok=True)
    pngs: list[tuple[str, Path]] = []
    caption, fig = _knee_figure(result)
    pngs.append((caption, save(fig, out / "knee.png")))
    groups = groups_of(result)
    cdf_groups, notes = _plottable(groups, "latency_samples")
    if cdf_groups:
        fig = latency_cdf(cdf_groups, lambda s: s.ttft_s, "TTFT CDF", _limits(result, "ttft"))
        pngs.append(("TTFT CDF per run", save(fig, out / "cdf_ttft.png")))
        fig = latency_cdf(cdf_groups, lambda s: s.e2e_s, "E2E CDF", _limits(result, "e2e"))
        pngs.append(("End-to-end latency CDF per run", save(fig, out / "cdf_e2e.png")))
    ts_groups, ts_notes = _plottable(groups, "timeseries")
    notes += ts_notes
    if ts_groups:
        for what, series_of, ylabel, title, cumulative in _TIME_SERIES:
            fig = timeseries_plot(ts_groups, series_of, what, ylabel, title, cumulative)
            pngs.append((f"{title} over time", save(fig, out / f"ts_{what}.png")))
        pngs.append(("Prefill and decode tokens per step over time",
                     save(tokens_per_step_plot(ts_groups), out / "ts_tokens_per_step.png")))
    return pngs, notes


_TIME_SERIES: tuple[tuple[str, Callable[[TimeSeries], list[float]], str, str, bool], ...] = (
    ("waiting", lambda ts: ts.waiting, "requests waiting", "waiting queue", False),
    ("running", lambda ts: ts.running, "sequences running", "running batch", False),
    ("preemptions", lambda ts: ts.preemptions, "preemptions so far",
     "preemptions (cumulative)", True),
)


def write_report(result: ReportResult, out_dir: str | Path) -> Path:
    """Write the PNGs and index.html into out_dir; returns the page's path."""
    out = Path(out_dir)
    pngs, notes = write_plots(result, out)
    figures = "".join(
        f"<figure><img alt='{html.escape(cap)}' src='data:image/png;base64,"
        f"{base64.b64encode(path.read_bytes()).decode()}'><figcaption>{html.escape(cap)} "
        f"({path.name})</figcaption></figure>" for cap, path in pngs)
    note_html = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
    kind = result_kind(result)
    title = f"stepserve {kind}: {_scenario(result) or ', '.join(r.name for r in result.runs)}"
    description, cost_model = ("", "") if isinstance(result, BenchResult) else \
        (result.description, str(result.cost_model))
    knee_text = f"<pre>{html.escape(format_knees(result))}</pre>" \
        if isinstance(result, SweepResult) else \
        f"<p>A {kind} result: runs are compared side by side; no knee is computed.</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for _k, h, _f in SUMMARY_COLUMNS)
    rows = "".join(f"<tr><td>{html.escape(r.name)}</td>" + "".join(
        f"<td>{'-' if (v := r.summary.metric(k)) is None else f.format(v)}</td>"
        for k, _h, f in SUMMARY_COLUMNS) + "</tr>" for r in result.runs)
    findings = "".join(
        f"<li><b>{html.escape(f.run or '')}</b> [{html.escape(f.severity)}] "
        f"{html.escape(f.rule)}: {html.escape(f.evidence)} &rarr; "
        f"{html.escape(f.action)}</li>" for f in result.findings)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:auto}}
table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
img{{max-width:100%}}.note{{color:#a60}}pre{{font-size:12px;background:#f6f6f6;padding:6px}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>{html.escape(description)}</p>
<p>Cost model: {html.escape(cost_model)}</p>
<h2>Knee</h2>{knee_text}
<h2>Runs</h2><table><tr><th>run</th>{head}</tr>{rows}</table>
<h2>Alert rules</h2>{f"<ul>{findings}</ul>" if findings else "<p>No alert rule fired.</p>"}
<h2>Plots</h2>{note_html}{figures}
</body></html>"""
    path = out / "index.html"
    write_atomic(path, page)
    return path


@dataclass(frozen=True)
class ReportOptions:
    result: str  # the JSON result file
    out: str  # the folder for index.html and the PNGs


def run_report(options: ReportOptions) -> int:
    """Check the result, write the report, say where; the exit status."""
    check_output_dir("--out", options.out)  # before reading and plotting
    result = load_json(options.result, "result file")
    _check_runs(result, options.result)
    try:
        page = write_report(load_result(result, options.result), options.out)
    except UsageError:
        raise
    except (AttributeError, KeyError, OverflowError, TypeError, ValueError) as e:
        # a part no check reads (its workload, findings, a sweep's points) not as written
        raise UsageError(f"{options.result}: not a result this report can read "
                         f"({type(e).__name__}: {e})") from None
    except OSError as e:  # the disk filled up, or the folder went away meanwhile
        raise UsageError(f"--out {options.out!r}: cannot write the report ({e})") from None
    print(f"wrote {page}")
    return 0


def _check_runs(result: Any, where: str) -> None:
    """A result with runs to plot (or a vLLM result, one run), every run's summary and
    config holding only values a run can have: checked as `stepserve doctor` checks them
    (metrics.result_runs), so no plot or table is made of a NaN, a 1e30 or a string."""
    if not is_vllm_result(result):
        if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
            raise UsageError(f"{where}: not a sweep, simulate, bench or vLLM bench result "
                             "(no runs list, no vLLM result keys)")
        if not result["runs"]:
            raise UsageError(f"{where}: the result has no runs: nothing to plot")
    result_runs(result, where)


def load_result(data: Mapping[str, Any], where: str) -> ReportResult:
    """A result file of any version as its type: a sweep names its kind, a bench run its
    target, a `vllm bench serve --save-result` file its flat keys; anything else with
    runs is read as a simulate result."""
    if is_vllm_result(data):
        return bench_result_from_vllm(data, Path(where).stem)
    if data.get("kind") == KIND:
        return SweepResult.from_json(data, where)
    runs = data["runs"]
    if runs and all("target" in r for r in runs):
        return BenchResult.from_json(data, where)
    return SimulateResult.from_json(data, where)


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
                     + " ".join(f"{c.removesuffix('_s'):>9}" for c in others)
                     + f" {'preempt':>7} {'hit':>6}  slo")
        for i, run in enumerate(group):
            lines.append(_row(run, knee, i, metric, others))
        lines += _verdict(result, knee, metric)
    both = agreement(result.knees)
    if both:
        lines += ["", both]
    return "\n".join(lines)


def _row(run: SweepPointResult, knee: KneeResult, i: int, metric: str, others: list[str]) -> str:
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
    if result.knee_rule.slos:  # worded for what varied: a load, a setting, unordered runs
        slo_text = " and ".join(s.describe() for s in result.knee_rule.slos)
        ordered, best = is_ordered(knee.xs, x), knee.best_slo_index
        words = "highest load meeting" if x in LOAD_AXES else \
            f"highest {x} meeting" if ordered else "points meeting"
        met = ("none" if best is None else format_x(knee.xs[best])) if ordered else \
            ", ".join(format_x(v) for v, ok in zip(knee.xs, knee.slo_met) if ok) or "none"
        lines.append(f"  {words} {slo_text}: {met}")
    rec = knee.recommended_index
    lines.append(f"  recommended: {'none' if rec is None else format_x(knee.xs[rec])} "
                 f"({knee.reason})")
    return lines


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
