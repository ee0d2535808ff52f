"""Every flag, the config built from flags and config file, and the KV pool it implies
are checked before any input file (trace, Mooncake trace, workload file, ShareGPT file)
is read: a wrong flag must not wait for a 200,000-line trace to load. Each input here is
a path that does not exist, so a command that read it first would report the missing
file instead of the flag; without the bad flag, it does report the file (the control)."""

from __future__ import annotations

from pathlib import Path

import pytest

import stepserve.sweep.points as sweep_points
from stepserve.cli import main

MISSING = "{missing}"  # replaced by a path in the test's folder that is never created
# a derived KV pool one block-row over its limit: 65,536 sequences x 257 blocks
KV_OVER = ["--cost", "constant", "--max-num-seqs", "65536", "--max-model-len", "4097"]
BAD_CONFIG = "scheduler:\n  max_num_seqs: 0\n"

SOURCES = {
    "simulate trace": ["simulate", "--no-progress", "--trace", MISSING],
    "simulate mooncake trace": ["simulate", "--no-progress", "--trace", MISSING,
                                "--trace-format", "mooncake"],
    "simulate workload": ["simulate", "--no-progress", "--workload", MISSING],
    "sweep workload": ["sweep", "--quiet", "--workload", MISSING],
    "bench sim mooncake": ["bench", "--sim", "--no-progress", "--dataset-name", "mooncake",
                           "--dataset-path", MISSING],
    "bench sim sharegpt": ["bench", "--sim", "--no-progress", "--dataset-name", "sharegpt",
                           "--dataset-path", MISSING],
    "bench sim workload": ["bench", "--sim", "--no-progress", "--workload", MISSING],
}

# (a source, the bad flags, what the one line must name)
ROWS = [
    *[(source, ["--max-num-seqs", "0"], "max_num_seqs = 0") for source in SOURCES],
    *[(source, ["--config", "{bad_config}"], "max_num_seqs = 0") for source in SOURCES],
    *[(source, KV_OVER, "max_num_seqs 65,536 x max_model_len 4,097") for source in SOURCES],
    ("simulate trace", ["--cost", "constant", "--num-gpu-blocks", "8"],
     "cannot hold one sequence"),
    ("simulate trace", ["--swap-space", "4"], "swap_space = 4"),
    ("simulate trace", ["--runs", "static"], "--runs static"),
    ("simulate trace", ["--trace-slowdown", "0"], "--trace-slowdown"),
    ("simulate mooncake trace", ["--trace-block-tokens", "0"], "--trace-block-tokens"),
    ("simulate workload", ["--model-spec", "nope"], "--model-spec"),
    ("sweep workload", ["--cost", "constant", "--max-model-len", "4097",
                        "--vary", "max_num_seqs=16,65536"], "max_num_seqs 65,536"),
    ("bench sim workload", ["--burstiness", "2"], "--burstiness needs --request-rate"),
]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bad.yaml").write_text(BAD_CONFIG)
    return {"missing": str(tmp_path / "never-written.jsonl"),
            "bad_config": str(tmp_path / "bad.yaml")}


def _argv(args: list[str], paths: dict[str, str]) -> list[str]:
    return [paths["missing"] if a == MISSING else
            paths["bad_config"] if a == "{bad_config}" else a for a in args]


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("source", SOURCES)
def test_without_a_bad_flag_the_missing_input_is_what_is_reported(source, paths, capsys):
    assert main(_argv(SOURCES[source], paths)) == 2
    assert "never-written.jsonl" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("source, flags, needle", ROWS,
                         ids=[f"{s}: {' '.join(f)}" for s, f, _ in ROWS])
def test_a_bad_flag_is_refused_before_any_input_is_read(source, flags, needle, paths,
                                                        capsys):
    assert main(_argv([*SOURCES[source], *flags], paths)) == 2
    line = _one_line(capsys.readouterr().err)
    assert needle in line and "never-written" not in line, line


class Ran(Exception):
    """Raised by a stand-in for a sweep point's simulation: none may run."""


def test_a_sweep_point_whose_kv_pool_is_refused_stops_the_sweep_before_its_first_point(
        monkeypatch, capsys):
    def no_point(*args, **kwargs):
        raise Ran

    monkeypatch.setattr(sweep_points, "simulate_run", no_point)
    argv = ["sweep", "--quiet", "--scenario", "quickstart", "--scenario-runs", "A",
            "--cost", "constant", "--max-model-len", "4097", "--requests", "10"]
    assert main([*argv, "--vary", "max_num_seqs=16,65536"]) == 2
    assert "max_num_seqs 65,536" in _one_line(capsys.readouterr().err)
    with pytest.raises(Ran):  # every point allowed: the sweep gets as far as its first
        main([*argv, "--vary", "max_num_seqs=16,32"])
