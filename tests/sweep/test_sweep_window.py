"""A sweep point is measured over its steady window: warm-up and drain left out, the
window named in the table, a too-short window flagged, and a high rate given enough
arrivals by default to have one."""

import json

import pytest

from stepserve.sim.scenarios import get_scenario
from stepserve.sweep.points import MAX_SIZED_REQUESTS, MIN_SPAN_S, sized_workload
from stepserve.sweep.window import (
    MIN_WINDOW_REQUESTS,
    WindowRule,
    steady_window,
    tokens_between,
)
from stepserve.workload.overrides import WorkloadOverrides

ARRIVALS = [i * 0.5 for i in range(201)]  # 100 s of arrivals, two a second


def test_the_window_runs_from_the_warm_up_to_the_last_arrival():
    w = steady_window(ARRIVALS, WindowRule())
    assert (w.start_s, w.end_s) == (10.0, 100.0) and w.steady  # 10% of the span
    assert w.requests == sum(1 for t in ARRIVALS if t >= 10.0)
    # a lifetime longer than the share is the warm-up: the batch fills in about one
    assert steady_window(ARRIVALS, WindowRule(), lifetime_s=25.0).start_s == 25.0
    assert steady_window(ARRIVALS, WindowRule(warmup_share=0.5)).start_s == 50.0


def test_no_steady_state_falls_back_to_the_whole_run():
    at_once = steady_window([0.0] * 50, WindowRule())
    assert not at_once.steady and "at once" in at_once.note
    few = steady_window(ARRIVALS[:MIN_WINDOW_REQUESTS], WindowRule())
    assert not few.steady and "fewer than" in few.note
    whole = steady_window(ARRIVALS, WindowRule("whole"))
    assert not whole.steady and (whole.start_s, whole.end_s) == (0.0, 100.0)
    with pytest.raises(ValueError, match="allowed: steady, whole"):
        WindowRule("drain")


def test_a_window_shorter_than_two_lifetimes_is_unsettled():
    assert steady_window(ARRIVALS, WindowRule(), lifetime_s=20.0).settled
    assert not steady_window(ARRIVALS, WindowRule(), lifetime_s=60.0).settled


def test_tokens_are_counted_where_they_were_produced():
    times = [[1.0, 2.0, 3.0], [9.0, 10.0, 11.0, 12.0]]
    assert tokens_between(times, 2.0, 10.0) == 4


def test_a_high_rate_gets_enough_arrivals_unless_the_size_was_given():
    workload = get_scenario("quickstart").workload_with(WorkloadOverrides(num_requests=600,
                                                                          rate=96.0))
    assert sized_workload(workload, MIN_SPAN_S).num_requests == 96 * 60
    assert sized_workload(workload, None).num_requests == 600  # --requests or --duration-s
    slow = get_scenario("quickstart").workload_with(WorkloadOverrides(num_requests=600,
                                                                      rate=6.0))
    assert sized_workload(slow, MIN_SPAN_S).num_requests == 600
    fast = get_scenario("quickstart").workload_with(WorkloadOverrides(rate=1000.0))
    assert sized_workload(fast, MIN_SPAN_S).num_requests == MAX_SIZED_REQUESTS


def test_the_drain_no_longer_sets_a_saturated_points_throughput(tmp_path, cli, capsys):
    # config B past its capacity: over the whole run the drain (arrivals over, the batch
    # emptying) pulls throughput down; the steady window leaves it out
    out = tmp_path / "b.json"
    assert cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "B", "--vary",
                "rate=48", "--duration-s", "30", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured over each point's steady window" in text
    (run,) = json.loads(out.read_text())["runs"]
    window = run["window"]
    assert window["steady"]
    assert window["start_s"] >= 3.0 and window["end_s"] <= 30.0
    assert run["summary"]["duration_s"] == pytest.approx(window["end_s"] - window["start_s"])
    assert run["summary"]["throughput_tokens_per_s"] > 1.2 * window["whole_run_tokens_per_s"]
    assert cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "B", "--vary",
                "rate=48", "--duration-s", "30", "--window", "whole", "--quiet",
                "--json", str(out)]) == 0
    assert "measured over each point's whole run" in capsys.readouterr().out
    (whole,) = json.loads(out.read_text())["runs"]
    assert whole["summary"]["throughput_tokens_per_s"] == pytest.approx(
        window["whole_run_tokens_per_s"])
