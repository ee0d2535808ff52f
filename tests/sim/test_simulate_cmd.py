"""`stepserve simulate` and `stepserve doctor` end to end, through cli.main."""

import json

import yaml

from stepserve.cli import main


def test_simulate_scenario_writes_the_documented_json(tmp_path, capsys):
    out = tmp_path / "night.json"
    rc = main(["simulate", "--scenario", "night-report", "--requests", "256",
               "--no-progress", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "continuous / static throughput" in text and "low_slot_utilization" in text
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["runs"]] == ["static", "dynamic", "continuous"]
    for run in result["runs"]:
        assert {"name", "batching", "config", "summary"} <= set(run)
        for key in ("requests_total", "requests_finished", "requests_rejected",
                    "requests_timed_out", "output_tokens", "throughput_tokens_per_s",
                    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                    "e2e_p99_s", "preemptions", "slot_utilization", "prefill_step_share",
                    "zero_decode_step_share"):
            assert key in run["summary"], key
        assert set(run["by_class"]) == {"long", "short"}
    assert {"speedup", "speedup_cap"} <= set(result["comparison"])
    for f in result["findings"]:
        assert {"run", "rule", "severity", "evidence", "action"} <= set(f)

    rc = main(["doctor", str(out), "--json"])
    assert rc == 0
    doctor = json.loads(capsys.readouterr().out)
    rules = {(f["run"], f["rule"]) for f in doctor["findings"]}
    assert ("static", "low_slot_utilization") in rules


def test_simulate_workload_file_with_config_and_flags(tmp_path, capsys):
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "mine", "seed": 3, "num_requests": 200,
        "arrival": {"poisson": {"rate": 20.0}},
        "classes": [{"name": "a", "share": 1, "prompt": {"fixed": 100},
                     "output": {"uniform": [10, 50]}}]}))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"scheduler": {"max_num_seqs": 4}, "queue": {"max_waiting": 3}}))
    out = tmp_path / "r.json"
    rc = main(["simulate", "--workload", str(wl), "--config", str(cfg), "--cost", "constant",
               "--max-num-batched-tokens", "512", "--no-progress", "--json", str(out)])
    assert rc == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["config"]["scheduler"]["max_num_seqs"] == 4
    assert run["config"]["scheduler"]["max_num_batched_tokens"] == 512
    assert run["summary"]["requests_rejected"] > 0  # max_waiting 3 under 20 req/s
    assert run["summary"]["requests_total"] == 200


def test_simulate_rejects_a_bad_config_with_a_clear_message(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("scheduler: {max_num_seqs: -4}\n")
    rc = main(["simulate", "--scenario", "night-report", "--config", str(cfg), "--no-progress"])
    assert rc == 2
    assert "scheduler.max_num_seqs = -4" in capsys.readouterr().err
    cfg.write_text("scheduler: {max_num_seq: 4}\n")
    rc = main(["simulate", "--scenario", "night-report", "--config", str(cfg), "--no-progress"])
    assert rc == 2
    assert "unknown setting scheduler.max_num_seq" in capsys.readouterr().err
