"""PNG plots for `stepserve report`, drawn with matplotlib's Agg backend (no pyplot, no
display, no global state). Each function returns a Figure; `save` writes and closes it.

A Group is one panel's worth of runs: a sweep series (lines per swept value) or, for a
`simulate --json` result, all its runs (lines per run). Its runs carry their time series
and latency samples (a simulated run, a bench run, a sweep point).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from stepserve.metrics.run_data import LatencySamples
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.sweep.knee import all_numbers


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


def _figure(n_panels: int, cols: int = 1, height: float = 3.2,
            width: float = 7.5) -> tuple[Figure, list]:
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(n - 1, 1)) for i in range(n)]


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=90)
    return path


def latency_cdf(groups: list[Group], samples: Callable[[LatencySamples], list[float]],
                title: str) -> Figure:
    """Empirical CDF of some latency samples (seconds), one line per run."""
    fig, axes = _figure(len(groups))
    for ax, g in zip(axes, groups):
        for color, label, run in zip(_colors(len(g.runs)), g.labels, g.runs):
            assert run.latency_samples is not None, "groups hold runs with samples"
            xs = sorted(samples(run.latency_samples))
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, color=color, label=label, drawstyle="steps-post")
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{title}: {g.name}", fontsize=10)
        ax.set_xlabel("seconds")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return fig


def _xs(values: list[Any]) -> tuple[list[float], list[str] | None]:
    """Numeric x as is; anything else placed at 0, 1, 2 with tick labels."""
    if all_numbers(values):
        return [float(v) for v in values], None
    return list(range(len(values))), [str(v) for v in values]


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _once(ax, label: str) -> str:
    """A legend label the first time it is used on `ax`, hidden after."""
    seen = ax.get_legend_handles_labels()[1]
    return "_nolegend_" if label in seen else label


def knee_plot(series: list[KneeSeries], x_name: str, p99_metric: str) -> Figure:
    """Throughput and P99 against the swept value, one line per series; the knee is a red
    X with a dotted line, the recommendation a green star, the highest load meeting the
    SLOs a blue diamond."""
    fig, (ax_t, ax_p) = _figure(2)
    for color, s in zip(_colors(len(series)), series):
        xs, ticks = _xs(s.xs)
        for ax, ys in ((ax_t, s.throughput), (ax_p, s.p99)):
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color,
                    label=s.name)
            k, r = s.knee_index, s.recommended_index
            if k is not None and ys[k] is not None:
                ax.plot([xs[k]], [ys[k]], marker="X", ms=13, color="red", ls="none",
                        label=_once(ax, "knee"))
                ax.axvline(xs[k], color="red", ls=":", lw=0.8)
                ax.annotate(f"{s.name} knee @ {_fmt(s.xs[k])}", (xs[k], ys[k]),
                            xytext=(4, -12), textcoords="offset points", fontsize=7,
                            color="red")
            b = s.best_slo_index
            if b is not None and ys[b] is not None:
                ax.plot([xs[b]], [ys[b]], marker="D", ms=11, mfc="none", mec="royalblue",
                        mew=1.8, ls="none", label=_once(ax, "highest load meeting the SLO"))
            if r is not None and ys[r] is not None:
                ax.plot([xs[r]], [ys[r]], marker="*", ms=15, color="green", ls="none",
                        label=_once(ax, "recommended"))
            if ticks:
                ax.set_xticks(xs, ticks)
    ax_t.set_ylabel("output tokens / s")
    ax_t.set_title(f"throughput vs {x_name}", fontsize=10)
    ax_p.set_ylabel(f"{p99_metric}")
    ax_p.set_title(f"{p99_metric} vs {x_name}", fontsize=10)
    for ax in (ax_t, ax_p):
        ax.set_xlabel(x_name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _series(run: PlotRun) -> TimeSeries:
    assert run.timeseries is not None, "groups hold runs with a time series"
    return run.timeseries


def timeseries_plot(groups: list[Group], series: Callable[[TimeSeries], list[float]],
                    what: str, ylabel: str, title: str, cumulative: bool = False) -> Figure:
    """One series of the runs' time series (`what` names it) over time, one line per run
    (cumulative sums optional)."""
    fig, axes = _figure(len(groups))
    for ax, g in zip(axes, groups):
        for color, label, run in zip(_colors(len(g.runs)), g.labels, g.runs):
            ts = _series(run)
            ys = list(series(ts))
            if cumulative:
                total = 0
                for i, y in enumerate(ys):
                    total += y
                    ys[i] = total
            ax.plot(ts.t, ys, color=color, label=label, lw=1.1)
        if all(not any(series(_series(r))) for r in g.runs):
            ax.set_ylim(-0.5, 1)
            ax.text(0.5, 0.5, f"no {what} in any run", transform=ax.transAxes,
                    ha="center", color="grey")
        ax.set_title(f"{title}: {g.name}", fontsize=10)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def tokens_per_step_plot(groups: list[Group]) -> Figure:
    """Mean prefill and decode tokens per step in each time bin (tokens per second
    when the JSON has no per-bin step counts)."""
    fig, axes = _figure(2 * len(groups), cols=2, width=11)
    kinds: tuple[tuple[str, Callable[[TimeSeries], list[float]]], ...] = (
        ("prefill", lambda ts: ts.prefill_tokens), ("decode", lambda ts: ts.decode_tokens))
    for i, g in enumerate(groups):
        for j, (kind, tokens) in enumerate(kinds):
            ax = axes[2 * i + j]
            unit = "tokens / step"
            for color, label, run in zip(_colors(len(g.runs)), g.labels, g.runs):
                ts = _series(run)
                if ts.steps:
                    pts = [(t, v / n) for t, v, n in zip(ts.t, tokens(ts), ts.steps) if n]
                else:
                    unit = "tokens / s"
                    width = (ts.t[1] - ts.t[0]) if len(ts.t) > 1 else 1.0
                    pts = [(t, v / width) for t, v in zip(ts.t, tokens(ts))]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color,
                        label=label, lw=1.0)
            ax.set_title(f"{kind} {unit}: {g.name}", fontsize=10)
            ax.set_xlabel("time (s)")
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return fig
