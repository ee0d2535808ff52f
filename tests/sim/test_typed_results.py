"""Typed results end to end: every summary field a table row or a doctor rule reads exists
on RunSummary (checked on the source and on a real simulation), the rules' declared inputs
are fields, the ITL max is printed, and result files of any version read back."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from stepserve.bench.loadgen import SCRAPE_KEYS
from stepserve.bench.results import LATENCY_NAMES, SUMMARY_KEYS_ORDER
from stepserve.cli import main
from stepserve.demo import job as demo
from stepserve.metrics.live_window import LIVE_KEYS
from stepserve.metrics.rules import RULES, unevaluable
from stepserve.metrics.run_summary import FIELD_KINDS, RunSummary
from stepserve.sim.report import ROWS, format_result
from stepserve.sim.run import SimulateResult, run_scenario
from stepserve.sim.scenarios import get_scenario
from stepserve.sweep.knee import P99_METRIC
from stepserve.sweep.report import SUMMARY_COLUMNS
from stepserve.workload.overrides import WorkloadOverrides

SRC = Path(__file__).parents[2] / "src" / "stepserve"
# modules whose table rows and rules read a summary's fields as attributes
READERS = ["sim/report.py", "demo/job.py", "sweep/report.py", "sweep/knee.py",
           "metrics/rules.py", "bench/results.py", "sweep/points.py"]
METHODS = {name for name in dir(RunSummary) if not name.startswith("_")} - set(FIELD_KINDS)


@pytest.fixture(scope="module")
def result() -> SimulateResult:
    # mixed-pool: two request classes, a queue, and the before run starves decode
    return run_scenario(get_scenario("mixed-pool"), WorkloadOverrides(num_requests=200))


MAKERS = {"summarize_records", "summarize", "summarize_latencies", "live_summary"}


def _summary_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names that hold a RunSummary in a function: its parameters annotated so, the
    loop variables over a parameter annotated `Sequence[RunSummary]`, and locals assigned
    `<anything>.summary` or a summary maker's result."""
    hints = {a.arg: ast.unparse(a.annotation) for a in fn.args.args if a.annotation}
    names = {arg for arg, hint in hints.items() if hint == "RunSummary"}
    many = {arg for arg, hint in hints.items() if hint == "Sequence[RunSummary]"}
    for node in ast.walk(fn):
        if isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Name) \
                and node.iter.id in many and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        maker = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id in MAKERS
        if maker or (isinstance(value, ast.Attribute) and value.attr == "summary"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _row_getters(tree: ast.AST) -> list[ast.Lambda]:
    """The lambdas of the table rows (`ROWS`, `DEMO_ROWS`): each takes a RunSummary."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("ROWS") for t in targets):
                out += [n for n in ast.walk(node) if isinstance(n, ast.Lambda)]
    return out


def _summary_reads(tree: ast.AST) -> set[str]:
    """Attribute names read off a summary: on a name that holds one (see above; a row
    getter's parameter) and on `<anything>.summary`."""
    reads = set()
    scopes = [(fn, _summary_names(fn)) for fn in ast.walk(tree)
              if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes += [(fn, {a.arg for a in fn.args.args}) for fn in _row_getters(tree)]
    for fn, names in scopes:
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value
            if (isinstance(base, ast.Name) and base.id in names) or \
                    (isinstance(base, ast.Attribute) and base.attr == "summary"):
                reads.add(node.attr)
    return reads


@pytest.mark.parametrize("module", READERS)
def test_every_field_read_in_the_source_exists(module):
    reads = _summary_reads(ast.parse((SRC / module).read_text()))
    assert reads, module
    assert reads <= set(FIELD_KINDS) | METHODS, sorted(reads - set(FIELD_KINDS) - METHODS)


def test_every_field_named_in_a_table_or_a_flag_default_exists():
    named = [k for k, _h, _f in SUMMARY_COLUMNS] + list(SUMMARY_KEYS_ORDER) + \
        list(SCRAPE_KEYS) + list(LIVE_KEYS) + [P99_METRIC] + \
        [f"{n}_{s}_s" for n in LATENCY_NAMES for s in ("mean", "p50", "p95", "p99")]
    assert set(named) <= set(FIELD_KINDS), sorted(set(named) - set(FIELD_KINDS))


def test_every_row_and_rule_runs_on_a_real_summary(result):
    for run in result.runs:
        s = run.summary
        for label, row, _note in ROWS + demo.DEMO_ROWS:
            assert row(s), label  # a getter reading a missing field raises here
        assert unevaluable(s) == {}  # a simulation feeds every rule's declared inputs
        for rule in RULES:
            rule(s)
    itl = next(row for label, row, _ in ROWS if label == "ITL P99 / max")
    assert all(" / -" not in itl(r.summary) for r in result.runs)  # a real ITL max
    assert "ITL P99 / max" in format_result(result)


def test_a_rule_whose_inputs_are_none_cannot_run(result):
    real = result.runs[0].summary
    for rule in RULES:
        assert rule.needs and all(n in FIELD_KINDS for g in rule.needs for n in g)
        for group in rule.needs:
            blind = replace(real, **dict.fromkeys(group))
            assert rule(blind) is None, rule.name
            assert unevaluable(blind)[rule.name] == [" or ".join(group)]


def test_summaries_and_results_round_trip_through_json(result):
    data = json.loads(json.dumps(result.to_json()))
    assert data["schema_version"] == 1
    assert SimulateResult.from_json(data).to_json() == data
    run = result.runs[0]
    assert RunSummary.from_json(data["runs"][0]["summary"]) == run.summary
    assert set(run.by_class) == {"chat", "summary"}
    assert "slot_utilization" not in data["runs"][0]["by_class"]["chat"]  # request keys only


def test_the_simulate_table_prints_a_real_itl_max(capsys):
    assert main(["simulate", "--scenario", "quickstart", "--requests", "120",
                 "--no-progress"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ITL P99")]
    assert " / -" not in line and line.count(" ms") + line.count(" s ") >= 6


def test_files_of_earlier_versions_and_a_newer_one(result, tmp_path, capsys):
    old = result.to_json()
    del old["schema_version"]
    for run in old["runs"]:
        run["summary"].pop("itl_max_s")
        run.pop("note")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert main(["doctor", str(path), "--json"]) == 0
    rules = {(f["run"], f["rule"]) for f in json.loads(capsys.readouterr().out)["findings"]}
    assert rules == {(f.run, f.rule) for f in result.findings}
    pytest.importorskip("matplotlib")
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0
    newer = {**result.to_json(), "schema_version": 99}
    path.write_text(json.dumps(newer))
    for argv in (["doctor", str(path)], ["report", str(path), "--out", str(tmp_path / "r2")]):
        assert main(argv) == 2
        assert "schema_version 99 is newer" in capsys.readouterr().err


def test_the_source_check_catches_a_misspelt_field():
    code = ("ROWS = [('x', lambda s: f'{s.itl_maxx_s}', '')]\n"
            "def rule(s: RunSummary, cfg):\n    return s.preemption\n"
            "def log(run):\n    s = run.summary\n    return s.e2e_p99\n")
    assert _summary_reads(ast.parse(code)) == {"itl_maxx_s", "preemption", "e2e_p99"}
