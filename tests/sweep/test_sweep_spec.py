"""--vary parsing and the grid of points."""

import pytest

from stepserve.config.settings import EngineConfig
from stepserve.sim.scenarios import RunSpec
from stepserve.sweep.spec import build_points, parse_vary
from stepserve.workload.overrides import WorkloadOverrides


def test_vary_types_values_by_setting():
    axis = parse_vary("max_num_seqs=16,32,64")
    assert (axis.name, axis.values, axis.target) == ("max_num_seqs", (16, 32, 64), "config")
    assert parse_vary("rate=2,4.5").values == (2.0, 4.5)
    assert parse_vary("rate=2").target == "workload"
    assert parse_vary("enable-chunked-prefill=true,false").values == (True, False)


@pytest.mark.parametrize("text, match", [
    ("nope=1,2", "unknown"), ("max_num_seqs", "NAME=v1"), ("max_num_seqs=a", "not a int"),
    ("rate=1,1", "repeated"), ("enable_chunked_prefill=maybe", "'maybe' is not a bool")])
def test_bad_vary_is_rejected_with_the_name(text, match):
    with pytest.raises(ValueError, match=match):
        parse_vary(text)


def test_grid_last_axis_is_x_and_the_rest_make_series():
    runs = [RunSpec("A", EngineConfig()), RunSpec("B", EngineConfig())]
    x_axis, points = build_points(runs, [parse_vary("max_num_seqs=16,32"),
                                         parse_vary("rate=2,4,8")])
    assert x_axis == "rate"
    assert len(points) == 2 * 2 * 3
    assert points[0].series == "A max_num_seqs=16" and points[0].label.endswith("rate=2")
    assert [p.x for p in points[:3]] == [2.0, 4.0, 8.0]
    assert points[0].config.scheduler.max_num_seqs == 16
    assert points[0].workload_overrides == WorkloadOverrides(rate=2.0)
    assert points[-1].config.scheduler.max_num_seqs == 32


def test_no_axes_sweeps_the_runs_in_order():
    runs = [RunSpec(n, EngineConfig()) for n in "ABC"]
    x_axis, points = build_points(runs, [])
    assert x_axis == "run" and [p.x for p in points] == ["A", "B", "C"]
    assert {p.series for p in points} == {"configs"}


def test_a_bad_value_for_a_setting_names_it():
    runs = [RunSpec("A", EngineConfig())]
    with pytest.raises(ValueError, match="max_num_seqs"):
        build_points(runs, [parse_vary("max_num_seqs=0,8")])
