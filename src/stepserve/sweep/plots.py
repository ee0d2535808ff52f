"""PNG plots for `stepserve report`, drawn with matplotlib's Agg backend (no pyplot, no
display, no global state). Each function returns a Figure; `save` writes and closes it.

A Group is one panel's worth of runs: a sweep series (lines per swept value) or, for a
`simulate --json` result, all its runs (lines per run). Its runs carry their time series
and latency samples (a simulated run, a bench run, a sweep point). Lines that would hide
one another (the same data) are told apart by marker, dash and width, and the legend
says which equals which. The knee plot lives in knee_plot.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples


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


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(n - 1, 1)) for i in range(n)]


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
    return [Style(color, MARKERS[i % len(MARKERS)], DASHES[i % len(DASHES)],
                  1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1))
            for i, color in enumerate(_colors(n))]


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
        labels = distinct_labels(g.labels, data)
        for style, label, xs in zip(styles(len(g.runs)), labels, data):
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, label=label, drawstyle="steps-post", **style.kwargs())
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
            ys = list(series(ts))
            if cumulative:
                total = 0
                for i, y in enumerate(ys):
                    total += y
                    ys[i] = total
            lines.append((list(ts.t), ys))
        labels = distinct_labels(g.labels, lines)
        for style, label, (t, ys) in zip(styles(len(g.runs)), labels, lines):
            ax.plot(t, ys, label=label, **style.kwargs())
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
                lines.append(pts)
            labels = distinct_labels(g.labels, lines)
            for style, label, pts in zip(styles(len(g.runs)), labels, lines):
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                        **style.kwargs())
            label_axes(ax, f"{kind} {unit}: {g.name}", "time (s)", unit)
    return fig
