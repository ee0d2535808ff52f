"""`stepserve sweep` end to end on the simulator (small request counts)."""

import json

import yaml


def test_rate_sweep_over_quickstart_runs_finds_a_knee(tmp_path, cli, capsys):
    out = tmp_path / "sweep.json"
    rc = cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "A",
              "--vary", "rate=4,12,24,64", "--requests", "300", "--p99-metric", "ttft_p99_s",
              "--slo", "ttft_p99_s=2", "--quiet", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    # TTFT P99 jumps at 24 (missing the SLO there), throughput flat by 64: the knee is the
    # last point before the jump
    assert "knee: rate=12" in text and "recommended: 12" in text
    result = json.loads(out.read_text())
    assert result["kind"] == "sweep" and result["x_axis"] == "rate"
    assert [r["sweep"]["x"] for r in result["runs"]] == [4.0, 12.0, 24.0, 64.0]
    (knee,) = result["knees"]
    assert knee["knee_index"] == 1 and knee["cliff_index"] == 2
    assert knee["saturated_index"] == 3 and knee["throughput_gain"] < 0.05
    assert knee["p99_rise"] > 0.5
    run = result["runs"][0]
    # the summary holds the requests that arrived in the point's steady window
    assert run["window"]["steady"] and run["summary"]["requests_total"] == \
        run["window"]["requests"] > 0.8 * 300
    assert len(run["latency_samples"]["ttft_s"]) == run["latency_samples"]["count"]
    assert len(run["timeseries"]["t"]) == 200 and sum(run["timeseries"]["steps"]) > 0
    assert "_sim" not in run


def test_seed_configs_abc_over_rate_each_find_a_knee(tmp_path, cli, capsys):
    """The quick start: configs A, B, C under rising load; stop before the knee."""
    out = tmp_path / "abc.json"
    rc = cli(["sweep", "--scenario", "quickstart", "--vary", "rate=6,12,24,48,96",
              "--requests", "300", "--slo", "ttft_p99_s=2", "--quiet", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["knee_rule"]["p99_metric"] == "ttft_p99_s"  # the default tail metric
    knees = {k["series"]: k for k in result["knees"]}
    assert set(knees) == {"A", "B", "C"}
    for knee in knees.values():
        i = knee["knee_index"]
        assert i is not None, knee
        assert knee["throughput_gain"] < 0.05 and knee["p99_rise"] > 0.5
        assert knee["recommended_index"] is not None and knee["recommended_index"] <= i
        assert all(knee["slo_met"][: knee["recommended_index"] + 1])
    text = capsys.readouterr().out
    # 300 requests at 96 req/s arrive in 3 s: too short a window to settle, and said so
    assert "~ window shorter than 2 request lifetimes" in text
    assert text.count("<- knee") == 3
    for knee in knees.values():  # the highest load meeting the SLO, per series
        best = knee["best_slo_index"]
        assert knee["slo_met"][best] and not any(knee["slo_met"][best + 1:])
    assert text.count("highest load meeting ttft_p99_s <= 2: ") == 3


def test_scenario_runs_as_the_axis(tmp_path, cli, capsys):
    rc = cli(["sweep", "--scenario", "quickstart", "--requests", "100", "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "run sweep, series configs" in text
    for name in ("A", "B", "C"):
        assert f"\n  {name:>10} " in text


def test_config_files_and_a_setting_axis(tmp_path, cli, capsys):
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"scheduler": {"max_num_batched_tokens": 2048,
                                                   "max_model_len": 4096}}))
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({"scheduler": {"max_num_batched_tokens": 8192,
                                                 "max_model_len": 4096}}))
    out = tmp_path / "s.json"
    rc = cli(["sweep", "--scenario", "quickstart", "--configs", str(small), str(big),
              "--vary", "max_num_seqs=8,64", "--requests", "80", "--quiet",
              "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert [k["series"] for k in result["knees"]] == ["small", "big"]
    assert result["runs"][1]["config"]["scheduler"]["max_num_seqs"] == 64
    assert result["runs"][1]["config"]["scheduler"]["max_num_batched_tokens"] == 2048


def test_workload_file_rate_sweep(tmp_path, cli, capsys):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "tiny", "num_requests": 50,
        "arrival": {"poisson": {"rate": 5.0}},
        "classes": [{"name": "chat", "share": 1.0, "prompt": {"fixed": 100},
                     "output": {"fixed": 20}}]}))
    rc = cli(["sweep", "--workload", str(wl), "--vary", "rate=1,100", "--requests", "40",
              "--cost", "constant", "--max-num-seqs", "4", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert "rate sweep, series continuous" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_message(cli, capsys):
    assert cli(["sweep", "--scenario", "quickstart", "--vary", "bogus=1", "--quiet"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "Z", "--quiet"]) == 2
    assert "has A, B, C" in capsys.readouterr().err


def test_points_run_for_a_fixed_time(tmp_path, cli, capsys):
    out = tmp_path / "t.json"
    assert cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "A", "--vary",
                "rate=4,16", "--duration-s", "30", "--quiet", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["duration_s_per_point"] == 30
    for run in result["runs"]:
        sent = run["summary"]["requests_total"]
        rate = run["sweep"]["x"]
        # Poisson arrivals over 30 s: about rate x 30 requests, whatever --requests says
        assert 0.7 * rate * 30 < sent < 1.3 * rate * 30, (rate, sent)


def test_fixed_time_needs_arrival_times_on_the_simulator(tmp_path, cli, capsys):
    wl = tmp_path / "c.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "c", "num_requests": 20, "arrival": {"closed_loop": {"concurrency": 4}},
        "classes": [{"name": "a", "share": 1.0, "prompt": {"fixed": 10},
                     "output": {"fixed": 10}}]}))
    assert cli(["sweep", "--workload", str(wl), "--vary", "concurrency=2,4", "--duration-s",
                "5", "--quiet"]) == 2
    assert "closed-loop workload on the simulator runs a request count" in \
        capsys.readouterr().err
