"""Sweeping a setting at a fixed offered rate (`--rate`): every point gets that load, the
table shows every latency column, and the summary is worded for the setting."""

import json


def test_a_setting_swept_at_a_fixed_rate(tmp_path, cli, capsys):
    out = tmp_path / "s.json"
    assert cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "A", "--vary",
                "max_num_seqs=16,64", "--rate", "8", "--requests", "200",
                "--slo", "ttft_p99_s=2", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.strip().startswith("x "))
    for column in ("tok/s", "ttft_p99_s", "ttft_p50", "tpot_p99", "itl_p99", "e2e_p99"):
        assert column in header, header
    assert "highest max_num_seqs meeting ttft_p99_s <= 2:" in text
    assert "highest load" not in text
    for run in json.loads(out.read_text())["runs"]:
        window = run["window"]
        offered = window["requests"] / (window["end_s"] - window["start_s"])
        assert 5 < offered < 11, offered  # 8 req/s, not the scenario's own 24


def test_a_fixed_rate_and_a_rate_axis_exclude_each_other(cli, capsys):
    assert cli(["sweep", "--scenario", "quickstart", "--vary", "rate=4,8", "--rate", "8",
                "--quiet"]) == 2
    assert "--rate and --vary rate=... exclude each other" in capsys.readouterr().err


def test_named_runs_list_the_points_meeting_the_slo(cli, capsys):
    assert cli(["sweep", "--scenario", "quickstart", "--requests", "60", "--rate", "4",
                "--slo", "ttft_p99_s=2", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "points meeting ttft_p99_s <= 2: A, B, C" in text and "highest" not in text
