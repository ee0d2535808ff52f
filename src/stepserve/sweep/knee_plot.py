"""knee.png: throughput and the tail against what a sweep varied, or, for runs that are
no sweep (a simulate or bench result), per run.

* An ordered axis (a load, a numeric setting): one line per series; the knee (the last
  point before the P99 cliff) a red X with a dotted line, the recommendation a green
  star, the last point meeting the SLOs a blue diamond, each SLO on the plotted metrics
  a dashed horizontal line. A tail spanning more than two decades is drawn on a log
  scale, so the SLO line and the points below the cliff stay readable.
* A named axis (runs, policies, seeds, true/false): points per series, side by side at
  each name, not joined: a line between names would invent an order.
* No sweep: bars per run from zero (two runs of nearly equal throughput would otherwise
  fill the axis with a 0.1 tok/s difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from stepserve.sweep.knee import is_ordered
from stepserve.sweep.plots import distinct_labels, label_axes, panels, styles
from stepserve.sweep.spec import SummarySLO

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


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


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
        ax.annotate(f"{s.name} knee @ {_fmt(s.xs[k])}", (xs[k], ys[k]),
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


def _log_if_wide(ax, values: list[float | None], slos: Sequence[SummarySLO],
                 metric: str) -> None:
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
            line = style.kwargs(markers=False) if ordered else {"color": style.color,
                                                               "ls": "none"}
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
        ax.bar_label(bars, [fmt.format(v) if v is not None else "-" for v in values],
                     fontsize=8)
        ax.set_xticks(places, names)
        ax.set_ylim(0, max(heights + [0.0]) * 1.15 or 1.0)
        ax.set_title(f"{title} (runs side by side: no sweep, no knee)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    ax_t.set_ylabel("output tokens / s")
    ax_p.set_ylabel(p99_metric)
    return fig
