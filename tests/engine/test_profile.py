"""`stepserve profile --quick` on the tiny model writes a cost file the simulator takes as
`--cost FILE`; a cost file from another machine is used with a warning naming both."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main
from stepserve.sim.calibrated import TERMS, CalibratedCost
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for, this_host


@pytest.fixture(scope="module")
def cost_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "cost.json"
    assert main(["profile", "--model", "tiny", "--quick", "--repeats", "2", "--warmup",
                 "1", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_profile_writes_a_valid_cost_file(cost_file, capsys):
    data = json.loads(cost_file.read_text())
    cost = CalibratedCost.from_json(data)
    assert set(cost.coefficients) <= set(TERMS) and cost.coefficients.get("step", 0) > 0
    assert all(v >= 0 for v in cost.coefficients.values())
    for key in ("hardware", "host", "model", "dtype", "threads", "torch", "date", "grid",
                "fit_error", "kv_bytes_per_token", "kv_cache_bytes"):
        assert key in data, key
    assert data["host"] == this_host() and data["model"] == "tiny"
    assert len(data["grid"]) >= 10
    assert all(p["min_s"] <= p["median_s"] <= p["max_s"] for p in data["grid"])
    assert {"median", "p90", "max", "points"} <= set(data["fit_error"])
    # the engine's own work around the model: per step, per sequence, per request joining
    assert set(data["engine_overhead"]) == {"step_s", "seq_s", "join_s"}
    assert "scheduling overhead" in cost.describe() and "joining the batch" in cost.describe()


@pytest.mark.slow
def test_simulate_takes_the_cost_file(cost_file, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\nnum_requests: 40\narrival: {poisson: {rate: 5.0}}\n"
                        "classes: [{name: chat, prompt: {fixed: 32}, output: {fixed: 16}}]\n")
    out = tmp_path / "r.json"
    assert main(["simulate", "--workload", str(workload), "--cost", str(cost_file),
                 "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cost_model"].startswith("calibrated on tiny")
    assert result["runs"][0]["summary"]["requests_finished"] == 40
    assert "warning" not in capsys.readouterr().err  # measured here: nothing to say


def test_a_cost_file_from_elsewhere_warns_naming_both(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"schema": "stepserve.cost/1", "coefficients": {"step": 0.01},
                                "host": "Some Other CPU x 64 cores", "model": "default"}))
    setup = cost_setup_for(CostModelOptions(cost=str(path)))
    assert isinstance(setup.cost_model, CalibratedCost)
    err = capsys.readouterr().err
    assert "Some Other CPU x 64 cores" in err and this_host() in err


@pytest.mark.parametrize("content,words", [
    ("{}", "schema"),
    ('{"schema": "stepserve.cost/1", "coefficients": {"step": -1}}', "in [0, 60]"),
    ("not json", "not valid JSON"),
])
def test_a_bad_cost_file_is_one_line_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["simulate", "--scenario", "quickstart", "--requests", "20", "--cost",
                 str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "bad.json" in err
