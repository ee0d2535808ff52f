"""`stepserve doctor RESULT.json` on a summary whose values are of the wrong type (a
string or a list where a number belongs) is one error naming the run, the field, the
value's type and what is expected, exit 2: no rule could read such a value, so "no rule
fires" would be a silent lie."""

from __future__ import annotations

import json

import pytest
from metrics.test_doctor_cmd import STATIC, doctor, write

from stepserve.metrics.result_runs import wrong_types


def _error(capsys, path) -> str:
    assert doctor(path) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ")
    assert captured.err.count("\n") == 1
    return captured.err


@pytest.mark.parametrize(("key", "value", "message"), [
    ("ttft_p99_s", "high", "summary.ttft_p99_s = 'high' (a string): must be a number"),
    ("preemptions", [1], "summary.preemptions = [1] (a list): must be a number"),
    ("slot_utilization", True, "summary.slot_utilization = True (true or false): must be "
                               "a number"),
    ("errors", 3, "summary.errors = 3 (a number): must be an object"),
    ("batching", {"a": 1}, "summary.batching = {'a': 1} (an object): must be a string"),
    ("interrupted", "yes", "summary.interrupted = 'yes' (a string): must be true or false"),
])
def test_a_summary_field_of_the_wrong_type_is_an_error(tmp_path, capsys, key, value,
                                                       message):
    path = write(tmp_path, {"runs": [{"name": "nightly", "summary": {**STATIC, key: value}}]})
    err = _error(capsys, path)
    assert f"run nightly: values of the wrong type: {message} (or null)" in err


def test_a_bare_summary_is_checked_too(tmp_path, capsys):
    path = write(tmp_path, {**STATIC, "queue_time_p99_s": list(range(10_000))}, "bare.json")
    err = _error(capsys, path)
    assert "run bare: values of the wrong type: summary.queue_time_p99_s = [0, 1, 2, 3, " \
        "...] (a list): must be a number (or null)" in err
    assert len(err) < 300


def test_a_config_setting_the_advice_names_is_checked(tmp_path, capsys):
    path = write(tmp_path, {"runs": [{"name": "r", "summary": STATIC,
                                      "config": {"scheduler": {"max_num_seqs": "lots"}}}]})
    assert "config.scheduler.max_num_seqs = 'lots' (a string): must be a number" in \
        _error(capsys, path)


def test_nulls_unknown_keys_and_right_types_pass():
    summary = {**STATIC, "ttft_p99_s": None, "errors": {"http_500": 2}, "batching": "static",
               "interrupted": False, "by_class": "not read", "replicas": 2}
    config = {"scheduler": {"max_num_seqs": 8, "policy": 3}, "note": [1]}
    assert wrong_types(summary, config) == []


def test_our_own_result_files_pass(tmp_path, capsys):
    path = tmp_path / "r.json"
    from stepserve.cli import main

    assert main(["simulate", "--scenario", "quickstart", "--requests", "60", "--cost",
                 "constant", "--no-progress", "--json", str(path)]) == 0
    capsys.readouterr()
    assert doctor(path) == 0
    assert json.loads(path.read_text())["runs"]
