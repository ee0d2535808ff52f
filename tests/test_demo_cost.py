"""`stepserve demo --cost`: the simulated half runs on the chosen cost model (a profile
file predicts this machine) instead of the H100 roofline, and a bad choice is refused
before the minutes of real-engine work."""

from __future__ import annotations

import json

from stepserve.cli import main
from stepserve.demo.job import run_sim
from stepserve.sim.calibrated import CalibratedCost

# a CPU-like profile: 20 ms a step, 1 ms per prompt token, 0.2 ms per decoding sequence
COEFFICIENTS = {"step": 0.020, "seq": 200e-6, "token": 1e-3, "token_hi": 0.0,
                "kv_read": 0.0, "attn": 0.0, "swap": 0.0}


def test_the_simulated_half_follows_the_cost_file(tmp_path):
    path = tmp_path / "cost.json"
    meta = {"model": "default", "hardware": "test CPU", "kv_cache_bytes": 2 * 2**30,
            "kv_bytes_per_token": 23040}
    path.write_text(json.dumps(CalibratedCost(COEFFICIENTS, 64, meta).to_json()))
    roofline, lengths = run_sim("continuous", 300)
    profiled, same_lengths = run_sim("continuous", 300, str(path))
    assert lengths == same_lengths
    assert roofline.name == "h100-sim-continuous" and profiled.name == "sim-continuous"
    assert "calibrated" in profiled.describe
    # every decode step costs at least the 20 ms constant: a CPU, not an H100
    assert profiled.summary.mean_step_s >= 0.020 > roofline.summary.mean_step_s
    assert profiled.summary.requests_finished == roofline.summary.requests_finished == 300


def test_a_bad_cost_choice_is_refused_before_the_real_runs(tmp_path, capsys):
    assert main(["demo", "--cost", str(tmp_path / "missing.json"), "--requests", "1"]) == 2
    err = capsys.readouterr()
    assert "missing.json" in err.err and "real engine" not in err.out
