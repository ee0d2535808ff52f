"""`stepserve simulate`: a scenario's run changed by engine flags is named as changed and
the overridden settings are printed; `--runs` names only runs that exist."""

import json

from stepserve.cli import main

QUICK = ["simulate", "--scenario", "quickstart", "--requests", "30", "--no-progress"]


def test_a_run_changed_by_engine_flags_is_named_for_the_change(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*QUICK, "--runs", "A,B", "--max-num-seqs", "32", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "settings from the command line over the scenario's runs:" in text
    assert "  A: max_num_seqs 64 -> 32 (run named 'A (max_num_seqs=32)')" in text
    assert "  B: max_num_seqs 512 -> 32" in text
    names = [r["name"] for r in json.loads(out.read_text())["runs"]]
    assert names == ["A (max_num_seqs=32)", "B (max_num_seqs=32)"]


def test_a_flag_that_changes_nothing_keeps_the_name(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*QUICK, "--runs", "A", "--max-num-seqs", "64", "--json", str(out)]) == 0
    assert "  A: none changed" in capsys.readouterr().out
    assert [r["name"] for r in json.loads(out.read_text())["runs"]] == ["A"]


def test_runs_must_name_runs_that_exist(tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\nnum_requests: 5\narrival: {poisson: {rate: 1.0}}\n"
                        "classes: [{name: a, share: 1.0, prompt: {fixed: 10}, "
                        "output: {fixed: 5}}]\n")
    assert main(["simulate", "--workload", str(workload), "--runs", "bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --runs bogus: a workload file makes one run, continuous (its "
                   "batching); allowed: continuous, or no --runs"]
    assert main(["simulate", "--workload", str(workload), "--runs", "continuous",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*QUICK, "--runs", "bogus"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: --runs bogus: scenario quickstart has runs A, B, C"
