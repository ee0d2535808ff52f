"""A user's mistake on any `stepserve` subcommand (serve's own in tests/server)
costs one line on stderr, `error: ...` naming what was wrong, and exit status 2: never a
traceback, and never after the work (an unwritable output path is refused before any
simulation runs)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stepserve.sim.job as sim_commands
from stepserve.cli import main

RANDOM = ["--random-input-len", "4", "--random-output-len", "3", "--no-progress"]
QUICK = ["simulate", "--scenario", "quickstart", "--no-progress"]
CAPACITY = ["plan", "capacity", "--kv-memory", "38GB", "--kv-bytes-per-token", "192KiB",
            "--max-len", "4096", "--peak-concurrency", "140"]
GOOD_SUMMARY = {"requests_total": 10, "preemptions": 0, "slot_utilization": 0.8}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Bad (and a few good) user files, by name, for the rows' {placeholders}."""
    d = tmp_path_factory.mktemp("user_files")
    texts = {
        "huge.yaml": "num_requests: 1000000000000\narrival: {poisson: {rate: 1}}\n"
                     "classes: [{name: a, prompt: 10, output: 10}]\n",
        "ok.yaml": "num_requests: 10\narrival: {poisson: {rate: 1}}\n"
                   "classes: [{name: a, prompt: 10, output: 10}]\n",
        "long.yaml": "num_requests: 10\narrival: {closed_loop: {concurrency: 4}}\n"
                     "classes: [{name: a, prompt: {fixed: 2000000}, output: 10}]\n",
        "bad.yaml": "num_requests: 10\n  oops: [\n",
        "trace.yaml": "arrival: {trace: bad.jsonl}\n",
        "bad.jsonl": '{"arrival_s": 0, "prompt_len": 3, "output_len": 2}\n{"arrival_s": \n',
        "nan.json": json.dumps({"runs": [{"name": "r", "summary": {
            **GOOD_SUMMARY, "ttft_p99_s": float("nan")}}]}),
        "impossible.json": json.dumps({"runs": [{"name": "r", "summary": {
            **GOOD_SUMMARY, "preemptions": -1, "e2e_p99_s": -0.5, "slot_utilization": 1.5}}]}),
        "empty.json": '{"runs": []}',
        "truncated.json": '{"runs": [{"name": "r",\n "summary": ',
        "good.json": json.dumps({"runs": [{"name": "r", "summary": GOOD_SUMMARY}]}),
    }
    paths = {"dir": str(d)}
    for name, text in texts.items():
        (d / name).write_text(text)
        paths[name] = str(d / name)
    (d / "binary.json").write_bytes(b"\xff\xfe not text")
    paths["binary.json"] = str(d / "binary.json")
    return paths


# (argv with {file} placeholders, what the one line must name)
ROWS = [
    # simulate
    ([*QUICK, "--json", "{dir}"], "--json"),
    ([*QUICK, "--json", "/nonexistent/dir/x.json"], "'/nonexistent/dir' does not exist"),
    ([*QUICK, "--json", "{ok.yaml}/x.json"], "is not a folder"),
    (["simulate", "--workload", "{huge.yaml}"], "num_requests = 1000000000000"),
    (["simulate", "--workload", "{long.yaml}"], "prompt.fixed = 2000000"),
    (["simulate", "--workload", "{bad.yaml}"], "line 2, column"),
    (["simulate", "--workload", "{binary.json}"], "not UTF-8"),
    (["simulate", "--workload", "{trace.yaml}"], "line 2: not valid JSON"),
    (["simulate", "--workload", "{dir}"], "it is a folder"),
    ([*QUICK, "--config", "{bad.yaml}"], "config file"),
    ([*QUICK, "--requests", "1000000000000"], "--requests = 1000000000000"),
    ([*QUICK, "--requests", "-5"], "--requests = -5"),
    # too big for a float, and quoted by its size rather than its 401 digits
    ([*QUICK, "--requests", "1" + "0" * 400], "--requests = <an integer of 1,329 bits>"),
    ([*QUICK, "--rate", "nan"], "--rate = nan"),
    ([*QUICK, "--rate", "inf"], "--rate = inf"),
    ([*QUICK, "--seed", "-1"], "--seed = -1"),
    (["serve", "--seed", "-1"], "--seed = -1: must be an integer in [0, "),
    (["serve", "--max-request-bytes", "12"],
     "--max-request-bytes = 12: must be an integer in [1024, "),
    ([*QUICK, "--max-num-seqs", "1000000000000000"], "max_num_seqs = 1000000000000000"),
    ([*QUICK, "--replicas", "100000"], "replicas = 100000"),
    ([*QUICK, "--runs", "A,Z"], "has runs A, B, C"),
    (["simulate", "--workload", "{ok.yaml}", "--model-spec", "nope"], "--model-spec"),
    (["simulate", "--workload", "{ok.yaml}", "--cost", "constant", "--step-ms", "nan"],
     "--step-ms = nan"),
    (["simulate", "--workload", "{ok.yaml}", "--cost", "constant", "--max-model-len",
      "1048576", "--max-num-seqs", "65536"], "num_gpu_blocks"),
    # doctor
    (["doctor", "{nan.json}"], "ttft_p99_s = nan"),
    (["doctor", "{impossible.json}"], "preemptions = -1"),
    (["doctor", "{impossible.json}"], "slot_utilization = 1.5: must be a finite number in [0, 1] (a share)"),
    (["doctor", "{empty.json}"], "no runs"),
    (["doctor", "{truncated.json}"], "line 2, column"),
    (["doctor", "{binary.json}"], "not UTF-8"),
    (["doctor", "{dir}/missing.json"], "no such file"),
    (["doctor", "--url", "http://[::1"], "--url 'http://[::1'"),
    (["doctor", "--url", "http://127.0.0.1:99999"], "port 99999"),
    (["doctor", "--url", "http://127.0.0.1:9", "--window-s", "nan"], "--window-s = nan"),
    (["doctor"], "exactly one of RESULT.json"),
    # bench
    (["bench", "--sim", *RANDOM, "--num-prompts", "1000000000000"], "--num-prompts"),
    (["bench", "--sim", *RANDOM, "--max-concurrency", "1000000000"], "--max-concurrency"),
    (["bench", "--sim", *RANDOM, "--request-rate", "nan"], "--request-rate = nan"),
    (["bench", "--sim", "--random-input-len", "0", "--random-output-len", "3"],
     "--random-input-len = 0"),
    (["bench", "--sim", *RANDOM, "--json", "{dir}"], "--json"),
    (["bench", "--sim", *RANDOM, "--csv", "/nonexistent/x.csv"], "--csv"),
    (["bench", "--target", "http://[::1", *RANDOM], "--target"),
    (["bench", "--sim", "--sharegpt", "{truncated.json}"], "line 2, column"),
    (["bench", "--sim", "--workload", "{huge.yaml}"], "num_requests"),
    (["bench", "--engine", "--model", "nope", *RANDOM], "unknown model 'nope'"),
    # sweep
    (["sweep", "--scenario", "quickstart", "--json", "{dir}"], "--json"),
    (["sweep", "--scenario", "quickstart", "--report", "{ok.yaml}"], "--report"),
    (["sweep", "--scenario", "quickstart", "--requests", "1000000000000"], "--requests"),
    (["sweep", "--scenario", "quickstart", "--slo", "ttft_p99_s=nan"], "--slo ttft_p99_s"),
    (["sweep", "--scenario", "quickstart", "--p99-metric", "nope"], "--p99-metric"),
    (["sweep", "--scenario", "quickstart", "--vary", "rate=nan"], "rate = nan"),
    (["sweep", "--workload", "{bad.yaml}"], "not valid YAML"),
    # report
    (["report", "{truncated.json}", "--out", "{dir}/r"], "line 2, column"),
    (["report", "{empty.json}", "--out", "{dir}/r"], "no runs"),
    (["report", "{good.json}", "--out", "{ok.yaml}"], "--out"),
    # plan
    (["plan", "speedup", "--group", "1000000000000x2000", "--concurrency", "64"], "--group"),
    (["plan", "speedup", "--group", "10x2000", "--concurrency", "1000000000000000"],
     "--concurrency"),
    ([*CAPACITY[:3], "9" * 40 + "TB", *CAPACITY[4:]], "--kv-memory"),
    ([*CAPACITY[:7], "-5", *CAPACITY[8:]], "--max-len = -5"),
    # generate, demo
    (["generate", "--model", "nope", "--prompt", "hi"], "unknown model 'nope'"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--device", "nonsense"], "--device"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--max-num-seqs", "0"],
     "max_num_seqs = 0"),
    (["demo", "--model", "tiny", "--short", "0"], "--short = 0"),
    (["demo", "--model", "tiny", "--json", "{dir}"], "--json"),
    (["demo", "--model", "nope"], "--model 'nope'"),
]


def _argv(row: list[str], files: dict[str, str]) -> list[str]:
    """The row with each {name} replaced by that file's path."""
    return [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], arg) for arg in row]


def _assert_one_line(err: str, needle: str) -> None:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], err


@pytest.mark.parametrize("row, needle", ROWS, ids=[" ".join(r[:4]) for r, _ in ROWS])
def test_a_mistake_is_one_line_and_exit_2(row, needle, files, capsys):
    assert main(_argv(row, files)) == 2
    captured = capsys.readouterr()
    _assert_one_line(captured.err, needle)


@pytest.mark.parametrize("row, needle", [
    ([*QUICK, "--json", "{dir}"], "--json"),
    (["doctor", "--url", "http://[::1"], "--url"),
    (["plan", "speedup", "--group", "10x2000", "--concurrency", "1000000000000000"],
     "--concurrency"),
])
def test_the_real_entry_point(row, needle, files):
    proc = subprocess.run([sys.executable, "-m", "stepserve", *_argv(row, files)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    _assert_one_line(proc.stderr, needle)


@pytest.mark.parametrize("row,needle", [
    ([*QUICK, "--requests", "many"], "--requests"),
    (["plan", "speedup", "--group", "1x2"], "--concurrency"),
    (["doctor", "--window-s", "x"], "--window-s"),
    (["report"], "required"),
    (["serve", "--port", "70000"], "70000 is not a port number"),
    (["simulate", "--scenario", "quickstart", "--frobnicate"], "--frobnicate"),
])
def test_argparse_usage_errors_are_one_line(row, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(row)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "error:" in err and needle in err and "Traceback" not in err


class Ran(Exception):
    """Raised by a stand-in for the simulation: it must not run."""


def _no_simulation(*args, **kwargs):
    raise Ran


@pytest.mark.parametrize("source", [["--scenario", "quickstart"], ["--workload", "{ok.yaml}"]])
def test_an_unwritable_output_is_refused_before_simulating(source, files, monkeypatch,
                                                           capsys):
    monkeypatch.setattr(sim_commands, "run_scenario", _no_simulation)
    monkeypatch.setattr(sim_commands, "run_all", _no_simulation)
    argv = ["simulate", *_argv(source, files), "--no-progress", "--json"]
    assert main([*argv, files["dir"]]) == 2  # refused: the stand-in never ran
    _assert_one_line(capsys.readouterr().err, "is a folder")
    with pytest.raises(Ran):  # a writable path gets as far as the simulation
        main([*argv, str(Path(files["dir"]) / "out.json")])


def test_our_own_results_pass_the_doctor(files, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*QUICK, "--runs", "A", "--requests", "30", "--json", str(out)]) == 0
    assert main(["doctor", str(out)]) == 0
    assert capsys.readouterr().err == ""
