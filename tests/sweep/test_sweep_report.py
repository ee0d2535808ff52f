"""`stepserve report`: files written, PNGs valid, plots hold data; both result shapes."""

import json

import pytest

from stepserve.metrics.summary import SAMPLE_CAP, step_timeseries, thin
from stepserve.sim.run import SimulateResult, run_scenario, simulate_run
from stepserve.sim.scenarios import get_scenario
from stepserve.sweep.job import SweepOptions, build_sweep, sweep_result
from stepserve.sweep.points import run_points
from stepserve.sweep.report import (
    Group,
    KneeSeries,
    knee_plot,
    latency_cdf,
    load_result,
    timeseries_plot,
    write_report,
)
from stepserve.sweep.result import SweepResult
from stepserve.workload.overrides import WorkloadOverrides

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["knee.png", "cdf_ttft.png", "cdf_e2e.png", "ts_waiting.png", "ts_running.png",
         "ts_preemptions.png", "ts_tokens_per_step.png"]


def _options(**kw) -> SweepOptions:
    base = dict(scenario="quickstart", scenario_runs="A,B", vary=("rate=4,24",), requests=60,
                slo=("ttft_p99_s=2",), min_throughput_gain=0.05, max_p99_rise=0.5,
                p99_metric="ttft_p99_s")
    return SweepOptions(**{**base, **kw})


@pytest.fixture(scope="module")
def sweep_json():
    options = _options()
    plan = build_sweep(options)
    runs, _ = run_points(plan.points, plan.make_workload, plan.cost, plan.blocks)
    result = sweep_result(plan, runs, options)
    data = json.loads(json.dumps(result.to_json()))
    assert SweepResult.from_json(data).to_json() == data  # the JSON round trip is exact
    return data


def _check_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] > 300 and im.size[1] > 200
        # drawn data: more than a blank canvas's handful of colours
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 50


def test_sweep_report_writes_html_and_valid_pngs(tmp_path, sweep_json):
    page = write_report(load_result(sweep_json, "sweep"), tmp_path / "rep")
    assert page.name == "index.html"
    for name in PLOTS:
        _check_png(tmp_path / "rep" / name)
    text = page.read_text()
    assert text.count("data:image/png;base64,") == len(PLOTS)
    assert "knee rule" in text and "series A" in text and "skipped" not in text


def test_plot_functions_draw_lines_with_data(sweep_json):
    runs = SweepResult.from_json(sweep_json).runs
    group = Group("A", ["rate=4", "rate=24"], list(runs[:2]))
    for fig in (latency_cdf([group], lambda s: s.ttft_s, "TTFT"),
                timeseries_plot([group], lambda ts: ts.running, "running", "running", "batch")):
        (ax,) = fig.axes
        assert len(ax.lines) >= 2 and all(len(line.get_xdata()) > 1 for line in ax.lines[:2])
    series = [KneeSeries("A", [4.0, 24.0], [1.0, 1.02], [1.0, 3.0], knee_index=1,
                         recommended_index=0)]
    fig = knee_plot(series, "rate", "ttft_p99_s")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"A", "knee (last point before the P99 cliff)", "recommended"} <= set(labels)


def test_simulate_result_with_and_without_per_run_data(tmp_path):
    scenario = get_scenario("quickstart")
    result = run_scenario(scenario, WorkloadOverrides(num_requests=40))
    assert all(r.timeseries is not None and r.latency_samples is not None for r in result.runs)
    spec = scenario.runs[0]
    run, sim = simulate_run(spec.name, spec.config,
                            scenario.workload_with(WorkloadOverrides(num_requests=40)).generate(),
                            scenario.cost_model(), scenario.num_gpu_blocks(spec.config), None,
                            spec.note)
    assert run.timeseries == result.runs[0].timeseries == step_timeseries(sim.steps)
    data = json.loads(json.dumps(result.to_json()))
    assert SimulateResult.from_json(data).to_json() == data  # the JSON round trip is exact
    for run in data["runs"][1:]:  # only run A keeps its per-run data
        run.pop("timeseries")
        run.pop("latency_samples")
    page = write_report(load_result(data, "sim"), tmp_path / "sim")
    text = page.read_text()
    assert "no knee is computed" in text
    assert "no `latency_samples` in the JSON for: B, C" in text
    for name in PLOTS:
        _check_png(tmp_path / "sim" / name)

    for run in data["runs"]:
        run.pop("timeseries", None)
        run.pop("latency_samples", None)
    page = write_report(load_result(data, "bare"), tmp_path / "bare")
    assert "no `timeseries` in the JSON" in page.read_text()
    assert sorted(p.name for p in (tmp_path / "bare").glob("*.png")) == ["knee.png"]
    _check_png(tmp_path / "bare" / "knee.png")


def test_report_command(tmp_path, cli, capsys, sweep_json):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(sweep_json))
    assert cli(["report", str(src), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "index.html").exists()
    src.write_text("[1, 2]")
    assert cli(["report", str(src), "--out", str(tmp_path / "o2")]) == 2
    assert "no runs list" in capsys.readouterr().err


def test_latency_samples_are_capped_keeping_the_cdf():
    values = [float(i) for i in range(3 * SAMPLE_CAP)]
    thinned = thin(values, SAMPLE_CAP)
    assert len(thinned) == SAMPLE_CAP and thinned[0] == 0.0 and thinned[-1] == values[-1]
    assert thinned[SAMPLE_CAP // 2] == pytest.approx(values[len(values) // 2], rel=0.01)
