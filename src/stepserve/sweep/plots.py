"""PNG plots for `stepserve report`, drawn with matplotlib's Agg backend (no pyplot, no
display, no global state). Lines that would hide one another (the same data) are told
apart by marker, dash and width, and the legend says which equals which.

knee.png, on an ordered axis (a load, a numeric setting): one line per series, the knee a
red X, the recommendation a green star, the last point meeting the SLOs a blue diamond,
each SLO a dashed line; a tail spanning over two decades on a log scale. On a named axis
(runs, policies, seeds) points side by side, not joined: a line would invent an order.
No sweep: bars per run from zero (nearly equal throughputs would otherwise fill the axis).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples
from stepserve.sweep.knee import is_ordered
from stepserve.sweep.spec import SummarySLO, format_x

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class PlotRun(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> RunSummary: ...

    @property
    def timeseries(self) -> TimeSeries | None: ...

    @property
    def latency_samples(self) -> LatencySamples | None: ...


@dataclass(frozen=True)
class Group:
    name: str
    labels: list[str]  # one per run, the line label
    runs: list[PlotRun]


def panels(n_panels: int, cols: int = 1, height: float = 3.2,
            width: float = 7.5) -> tuple[Figure, list]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # only when a report is drawn
    from matplotlib.figure import Figure

    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width, height * rows), layout="constrained")
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


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=90)
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
