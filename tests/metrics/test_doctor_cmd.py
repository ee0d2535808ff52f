"""`stepserve doctor RESULT.json [--json]`, driven through its own parser."""

import argparse
import json

import pytest

from stepserve.cli.doctor import add_doctor_parser

STATIC = {"slot_utilization": 0.1647, "active_ratio_p50": 0.156, "steps": 2000,
          "requests_total": 64}
HEALTHY = {"slot_utilization": 0.9, "active_ratio_p50": 0.95, "steps": 900,
           "requests_total": 64}
CHUNK = {"prefill_step_share": 0.95, "zero_decode_step_share": 0.9, "steps": 100}


def doctor(*argv):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    add_doctor_parser(sub)
    args = p.parse_args(["doctor", *map(str, argv)])
    return args.func(args)


def write(tmp_path, data, name="result.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def result_file(tmp_path):
    return write(tmp_path, {
        "runs": [
            {"name": "nightly", "batching": "static", "config": {}, "summary": STATIC},
            {"name": "after", "batching": "continuous", "config": {}, "summary": HEALTHY},
            {"name": "mixed", "batching": "continuous",
             "config": {"scheduler": {"max_num_batched_tokens": 32768,
                                      "long_prefill_token_threshold": 0}},
             "summary": CHUNK},
        ],
        "findings": [{"run": "stale", "rule": "ignored"}],
    })


def test_text_report_per_run(tmp_path, capsys):
    assert doctor(result_file(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "run nightly (static): 2 finding(s)" in out
    assert "[warning] low_slot_utilization" in out and "[warning] low_active_ratio" in out
    assert "evidence:" in out and "action:" in out and "16.5%" in out
    assert "run after (continuous): no rule fires" in out
    assert "[critical] chunk_cap_eats_budget" in out
    assert "long_prefill_token_threshold = 0" in out  # the run's config names the cap
    assert "ignored" not in out  # stored findings are not trusted; rules run afresh


def test_json_report(tmp_path, capsys):
    assert doctor(result_file(tmp_path), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["findings"]
    assert {(r["run"], r["rule"]) for r in rows} == {
        ("nightly", "low_slot_utilization"), ("nightly", "low_active_ratio"),
        ("mixed", "chunk_cap_eats_budget")}
    for r in rows:
        assert set(r) == {"run", "rule", "severity", "evidence", "action"}
        assert r["severity"] in ("critical", "warning", "info")


def test_a_bare_summary_is_one_run_named_after_the_file(tmp_path, capsys):
    path = write(tmp_path, STATIC, name="nightly.json")
    assert doctor(path, "--json") == 0
    rows = json.loads(capsys.readouterr().out)["findings"]
    assert {r["run"] for r in rows} == {"nightly"}
    assert {r["rule"] for r in rows} == {"low_slot_utilization", "low_active_ratio"}


def test_the_runs_batching_reaches_the_rules(tmp_path, capsys):
    path = write(tmp_path, {"runs": [{"name": "c", "batching": "continuous",
                                      "summary": {"slot_utilization": 0.3}}]})
    assert doctor(path) == 0
    assert "already continuous" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "Expecting property name"),
    ("[1, 2]", "expected a JSON object"),
    ('{"hello": 1}', "neither a result file"),
    ('{"runs": {}}', "must be a list"),
    ('{"runs": [{"name": "x"}]}', 'no "summary" object'),
    ('{"runs": [{"summary": {}, "config": 3}]}', "config must be an object"),
    ('{"runs": [7]}', "must be an object"),
])
def test_bad_files_exit_2_with_an_error(tmp_path, capsys, content, message):
    path = tmp_path / "missing.json" if content is None else write(tmp_path, content)
    assert doctor(path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err
