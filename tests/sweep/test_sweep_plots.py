"""knee.png and the line plots: the SLO drawn, runs that are no sweep as bars from zero,
names not joined by a line, and series of equal data told apart."""

from matplotlib.colors import to_hex

from stepserve.sweep.report import KneeSeries, distinct_labels, knee_plot, runs_plot, styles
from stepserve.sweep.spec import parse_summary_slo

RATES = [6.0, 12.0, 24.0, 48.0]


def test_the_slo_is_a_line_on_the_tail_panel_and_a_wide_tail_is_logarithmic():
    series = [KneeSeries("A", RATES, [1200, 2400, 3500, 3510], [0.2, 0.3, 22.0, 100.0],
                         knee_index=1, recommended_index=1, best_slo_index=1)]
    fig = knee_plot(series, "rate", "ttft_p99_s", [parse_summary_slo("ttft_p99_s=2")])
    ax_t, ax_p = fig.axes
    slo = [line for line in ax_p.lines if line.get_label() == "SLO ttft_p99_s <= 2"]
    assert len(slo) == 1 and list(slo[0].get_ydata()) == [2.0, 2.0]
    assert ax_p.get_yscale() == "log" and ax_t.get_yscale() == "linear"
    assert not any(line.get_label().startswith("SLO") for line in ax_t.lines)
    floor = knee_plot(series, "rate", "ttft_p99_s",
                      [parse_summary_slo("throughput_tokens_per_s>=3000")])
    assert any(line.get_label() == "SLO throughput_tokens_per_s >= 3000"
               for line in floor.axes[0].lines)


def test_runs_that_are_no_sweep_are_bars_from_zero():
    # before and after 0.1 tok/s apart: a line over a 1207.98-1208.10 axis, before
    fig = runs_plot(["before", "after"], [1207.98, 1208.10], [3.1, 0.4], "ttft_p99_s")
    ax_t, ax_p = fig.axes
    assert len(ax_t.patches) == 2 and not ax_t.lines
    assert ax_t.get_ylim()[0] == 0 and ax_t.get_ylim()[1] > 1208.10
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["before", "after"]


def test_a_named_axis_is_points_per_name_not_a_line():
    series = [KneeSeries("sim", ["A", "B", "C"], [3500, 4900, 4300], [22.0, 0.5, 7.0]),
              KneeSeries("sim 2", ["A", "B", "C"], [3400, 4800, 4200], [21.0, 0.6, 6.0])]
    fig = knee_plot(series, "run", "ttft_p99_s")
    ax_t = fig.axes[0]
    drawn = [line for line in ax_t.lines if line.get_label() in ("sim", "sim 2")]
    assert all(line.get_linestyle() == "None" for line in drawn)
    first, second = (list(line.get_xdata()) for line in drawn)
    assert all(a < b for a, b in zip(first, second))  # side by side at each name
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["A", "B", "C"]


def test_equal_series_are_told_apart():
    labels = distinct_labels(["static", "dynamic", "continuous"],
                             [[1, 2, 3], [1, 2, 3], [3, 2, 1]])
    assert labels == ["static", "dynamic (same as static)", "continuous"]
    first, second = styles(2)
    assert first.marker != second.marker and first.ls != second.ls
    assert first.lw > second.lw and to_hex(first.color) != to_hex(second.color)
