"""A bench result feeds `stepserve doctor` (the same findings the bench printed) and
`stepserve report` (latency CDFs, and queue/batch over time from the target's /metrics)."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main

SATURATING = ["--random-input-len", "16", "--random-output-len", "8", "--max-num-seqs", "2",
              "--request-rate", "200", "--num-prompts", "60", "--no-progress"]


def _doctor_rules(capsys, path) -> set[tuple[str, str]]:
    capsys.readouterr()
    assert main(["doctor", str(path), "--json"]) == 0
    return {(f["run"], f["rule"]) for f in json.loads(capsys.readouterr().out)["findings"]}


def test_a_saturated_sim_bench_result_feeds_the_doctor(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--sim", "--cost", "constant", *SATURATING, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    own = {(f["run"], f["rule"]) for f in result["findings"]}
    assert {("random", "queue_growing"), ("random", "running_below_offered")} <= own
    assert _doctor_rules(capsys, out) == own  # the doctor re-applies the same rules


def test_a_live_bench_result_names_the_servers_settings_and_reports(served, tmp_path,
                                                                    capsys):
    pytest.importorskip("matplotlib")
    served.wait_idle()
    out = tmp_path / "live.json"
    assert main(["bench", "--target", served.url, "--random-input-len", "16",
                 "--random-output-len", "8", "--max-concurrency", "4", "--num-prompts", "16",
                 "--metrics-interval-s", "0.05", "--no-progress", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    # published by the server (stepserve:scheduler_config_info), read back by the bench
    assert run["config"]["max_num_seqs"] == 64
    assert run["latency_samples"]["count"] == 16 == len(run["latency_samples"]["ttft_s"])
    ts = run["timeseries"]
    assert ts["t"][0] == 0.0 and len(ts["t"]) >= 2
    assert sum(ts["decode_tokens"]) == run["summary"]["server_generation_tokens"] == 16 * 8
    assert max(ts["running"]) <= 4
    _doctor_rules(capsys, out)  # a live result reads back without error
    report = tmp_path / "report"
    assert main(["report", str(out), "--out", str(report)]) == 0
    page = (report / "index.html").read_text()
    assert "<title>stepserve bench: random</title>" in page and "a bench result" in page
    for name in ("knee.png", "cdf_ttft.png", "cdf_e2e.png", "ts_waiting.png",
                 "ts_running.png", "ts_tokens_per_step.png"):
        assert (report / name).read_bytes()[:4] == b"\x89PNG", name


@pytest.mark.parametrize("where", [["--sim", "--cost", "constant"],
                                   ["--engine", "--model", "tiny", "--num-gpu-blocks", "128",
                                    "--max-model-len", "256"]], ids=["sim", "engine"])
def test_in_process_bench_results_carry_step_time_series(where, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.json"
    assert main(["bench", *where, "--random-input-len", "16", "--random-output-len", "8",
                 "--max-concurrency", "3", "--max-num-seqs", "3", "--num-prompts", "12",
                 "--no-progress", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["config"]["scheduler"]["max_num_seqs"] == 3  # the doctor can name it
    ts = run["timeseries"]
    # times from the run's start (not the engine clock's epoch); no more bins than steps
    assert 0 <= ts["t"][0] <= ts["t"][-1] <= run["summary"]["duration_s"] + 1.0
    assert len(ts["t"]) <= sum(ts["steps"]) and max(ts["running"]) <= 3
    assert sum(ts["decode_tokens"]) + sum(ts["prefill_tokens"]) >= 12 * (16 + 8) - 12
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "ts_tokens_per_step.png").exists()
