"""The shared-CPU rule: fires on a bench result whose engine shared its cores, is silent
on a quiet one, goes first and tells the latency findings the scheduler is not the
cause; and the /metrics window's cpu fields it reads."""

from __future__ import annotations

import json

import pytest

from stepserve.host.cpu_metrics import cpu_window
from stepserve.metrics.doctor import DoctorOptions, load_runs, run_doctor
from stepserve.metrics.live_window import live_summary
from stepserve.metrics.prometheus import Snapshot, parse_prometheus
from stepserve.metrics.rules import CPU_SHARED, NOT_THE_SCHEDULER, cpu_shared, diagnose, unevaluable
from stepserve.metrics.run_summary import RunSummary


def bench_result(others: float, wait: float, **summary) -> dict:
    """A bench --engine result file's shape."""
    return {"schema_version": 1, "runs": [{"name": "engine", "target": "engine", "summary": {
        "requests_total": 20, "requests_finished": 20, "steps": 400, "duration_s": 10.0,
        "cpu_others_cores": others, "cpu_wait_share": wait, "cpu_usable": 2,
        "step_time_over_quiet": 2.9, "cpu_source": "engine", **summary}}],
        "findings": []}


def write(tmp_path, data: dict) -> str:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_fires_on_a_shared_cpu(tmp_path, capsys):
    path = write(tmp_path, bench_result(0.98, 0.35))
    (run,) = load_runs(path)
    (finding,) = diagnose(run.summary, run.rule_settings())
    assert finding.rule == CPU_SHARED
    assert "the CPU is shared: other processes used 0.98 of 2 cores" in finding.evidence
    assert "the engine's threads waited 35% of their time for a core" in finding.evidence
    assert "steps took 2.9x their quiet time" in finding.evidence
    assert "taskset" in finding.action and "--threads" in finding.action
    assert NOT_THE_SCHEDULER in finding.action
    assert run_doctor(DoctorOptions(result=path)) == 0
    assert "[warning] cpu_shared" in capsys.readouterr().out


def test_silent_on_a_quiet_run(tmp_path):
    (run,) = load_runs(write(tmp_path, bench_result(0.02, 0.01)))
    assert diagnose(run.summary, run.rule_settings()) == []


@pytest.mark.parametrize(("others", "wait", "fires"), [
    (0.25, 0.0, True), (0.24, 0.0, False), (0.0, 0.10, True), (0.0, 0.099, False)])
def test_either_line_fires(others, wait, fires):
    s = RunSummary.of(cpu_others_cores=others, cpu_wait_share=wait, cpu_source="server")
    assert (cpu_shared(s) is not None) is fires


def test_silent_on_an_idle_engine_and_on_the_clients_machine():
    idle = RunSummary.of(cpu_others_cores=1.5, cpu_wait_share=0.5, steps=0)
    client = RunSummary.of(cpu_others_cores=1.5, cpu_source="client")
    assert cpu_shared(idle) is None and cpu_shared(client) is None


def test_goes_first_and_latency_findings_say_the_scheduler_may_not_be_the_cause():
    # a queue that grows for the whole run, and a shared CPU
    s = RunSummary.of(waiting_growth=2.0, waiting_trend_rise=40.0, waiting_max=40,
                      waiting_nonzero_share=0.9, steps=500, cpu_others_cores=0.98,
                      cpu_wait_share=0.35, cpu_usable=2, cpu_source="server")
    found = diagnose(s)
    assert found[0].rule == CPU_SHARED and len(found) > 1
    for f in found[1:]:
        assert "the CPU was shared over this run (cpu_shared)" in f.action
    quiet = diagnose(s.with_values(cpu_others_cores=0.0, cpu_wait_share=0.0))
    assert [f.rule for f in quiet] == [f.rule for f in found[1:]]
    assert all("cpu_shared" not in f.action for f in quiet)


def test_a_summary_without_cpu_data_is_not_short_of_rules():
    assert cpu_shared(RunSummary()) is None and CPU_SHARED not in unevaluable(RunSummary())


METRICS = """\
# TYPE stepserve:cpu_runqueue_wait_seconds counter
stepserve:cpu_runqueue_wait_seconds_total{{model_name="m",engine="0"}} {wait}
# TYPE stepserve:cpu_on_cpu_seconds counter
stepserve:cpu_on_cpu_seconds_total{{model_name="m",engine="0"}} {on}
# TYPE stepserve:cpu_others_seconds counter
stepserve:cpu_others_seconds_total{{model_name="m",engine="0"}} {others}
# TYPE stepserve:cpu_usable gauge
stepserve:cpu_usable{{model_name="m",engine="0"}} 2.0
# TYPE stepserve:step_time_over_quiet gauge
stepserve:step_time_over_quiet{{model_name="m",engine="0"}} {over}
# TYPE stepserve:steps counter
stepserve:steps_total{{model_name="m",engine="0"}} {steps}
"""


def snapshot(t_s: float, wait: float, on: float, others: float, over: float,
             steps: int) -> Snapshot:
    return Snapshot(t_s, parse_prometheus(METRICS.format(
        wait=wait, on=on, others=others, over=over, steps=steps)))


def test_a_live_window_reads_the_series_and_the_rule_fires():
    first = snapshot(100.0, wait=1.0, on=10.0, others=50.0, over=1.0, steps=10)
    last = snapshot(110.0, wait=4.5, on=16.5, others=59.8, over=2.9, steps=900)
    window = cpu_window(first, last)
    assert window["cpu_others_cores"] == pytest.approx(0.98)
    assert window["cpu_wait_share"] == pytest.approx(0.35)
    assert window["cpu_usable"] == 2.0 and window["step_time_over_quiet"] == 2.9
    assert window["cpu_source"] == "server"
    summary = live_summary([first, last])
    assert summary.cpu_others_cores == pytest.approx(0.98) and summary.steps == 890
    found = diagnose(summary)
    assert found and found[0].rule == CPU_SHARED
    assert "other processes used 0.98 of 2 cores" in found[0].evidence


def test_a_live_window_without_the_series_has_no_cpu_fields():
    a = Snapshot(0.0, parse_prometheus('stepserve:steps_total{engine="0"} 1\n'))
    b = Snapshot(1.0, parse_prometheus('stepserve:steps_total{engine="0"} 5\n'))
    assert all(v is None for v in cpu_window(a, b).values())
    assert all(f.rule != CPU_SHARED for f in diagnose(live_summary([a, b])))
