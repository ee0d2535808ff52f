"""The tools that read what a user or a server hands them, on corpora of hostile inputs:
`doctor --url` on mutated /metrics texts, `report` on mutated result files, `simulate
--cost` on mutated cost files and `simulate --trace` on mutated traces (ours and
Mooncake's). Each corpus holds non-finite and huge numbers, wrong types, missing and
extra keys, cut files, and big files of blank or long lines; every input must end in a
clean result (exit 0) or in exactly one error line and exit 2, never a traceback. The
corpora are drawn from a fixed seed, so a failure names an input that can be rebuilt."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from metrics.canned_texts import rising_vllm_texts
from metrics.test_doctor_url import metrics_server

from stepserve.cli import main
from stepserve.server.metrics import ServerMetrics
from stepserve.sim.cost_options import this_host
from stepserve.sweep import report

CORPUS = 220  # inputs per tool, at least 200
BAD_VALUES: tuple[Any, ...] = (
    float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 1e30, -1e30, 5e-324, -1, 0,
    10**30, -(10**30), 2**63, "x", "", "1e3", None, True, False, [], {}, [1, 2], {"a": 1},
    "é" * 300)
# texts no JSON reader should take whole: a number past Python's 4,300-digit limit,
# nesting past the recursion limit, a cut string, bytes that are not UTF-8
RAW_TEXTS = ("9" * 5000, "[" * 100_000, '{"a": "', "\udcff\udcfe{}", "", "   ", "null", "[]",
             "{}")


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    """The exit status and stderr of one command run in process; an exception that
    escapes is the traceback a user would see, and fails the test."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own refusals
        status = e.code
    return status, capsys.readouterr().err


def _assert_clean(status: int, err: str, what: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert status in (0, 2), f"{what}: exit {status}: {err[-2000:]}"
    if status == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {err[-2000:]}"
        assert "Traceback" not in err


def _leaves(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every path to a value in a JSON document (containers too, not the root)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*path, k)
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):  # a list's first few: its others are alike
            yield (*path, i)
            yield from _leaves(v, (*path, i))


def _set(doc: Any, path: tuple, value: Any, delete: bool = False) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def json_corpus(base: Any, rng: random.Random, n: int) -> list[str]:
    """`n` texts from `base`: a value replaced by a bad one or deleted, a key added, the
    whole document replaced, the text cut short, huge files of blank or long lines."""
    paths = list(_leaves(base))
    text = json.dumps(base)
    out = [*RAW_TEXTS, json.dumps(list(BAD_VALUES)), text[: len(text) // 2],
           text[:-1], text + " x", "\n" * 3_000_000, " " * 3_000_000 + text,
           json.dumps({"a": "y" * 20_000_000})]
    out += [json.dumps(v) for v in BAD_VALUES]
    while len(out) < n:
        path = rng.choice(paths)
        kind = rng.random()
        if kind < 0.8:
            doc = _set(base, path, rng.choice(BAD_VALUES))
        elif kind < 0.9:
            doc = _set(base, path, None, delete=True)
        else:
            doc = _set(base, (*path[:-1], "unknown_key"), rng.choice(BAD_VALUES)) \
                if isinstance(_get(base, path[:-1]), dict) else _set(base, path, [])
        out.append(json.dumps(doc))
    return out[:n]


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _write(tmp_path: Path, i: int, text: str, suffix: str) -> Path:
    path = tmp_path / f"input{i}{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # lone surrogates: raw bytes
    return path


# ---- simulate --cost ----

COST = {"schema": "stepserve.cost/1", "knee_tokens": 64,
        "coefficients": {"step": 0.004, "seq": 2e-5, "token": 1e-5, "kv_read": 1e-8},
        "host": this_host(), "hardware": "CPU", "model": "default", "date": "2026-12-04",
        "kv_cache_bytes": 1 << 30, "kv_bytes_per_token": 16384, "block_size": 16}
COSTS = json_corpus(COST, random.Random("cost"), CORPUS)


@pytest.mark.parametrize("i", range(len(COSTS)))
def test_simulate_cost_takes_any_cost_file(tmp_path, capsys, i):
    path = _write(tmp_path, i, COSTS[i], ".json")
    status, err = _run(capsys, ["simulate", "--scenario", "quickstart", "--requests", "5",
                                "--runs", "A", "--cost", str(path), "--no-progress"])
    _assert_clean(status, err, COSTS[i][:300])


# ---- simulate --trace ----

def trace_corpus(rng: random.Random, n: int) -> list[str]:
    ours = [{"arrival_s": 0.1 * k, "prompt_len": 20 + k, "output_len": 5, "max_tokens": 8,
             "priority": 0, "tenant": "t", "class": "c"} for k in range(3)]
    mooncake = [{"timestamp": 100 * k, "input_length": 600, "output_length": 4,
                 "hash_ids": [k, k + 1]} for k in range(3)]
    out = ["\n" * 3_000_000, "\n" * 10 + " " * 70_000_000 + "\n",
           json.dumps(ours[0]) + "\n" + "x" * 1000, "\n".join(["{}"] * 5), "[1, 2]",
           json.dumps(ours[0])[:-3], "\ufeff" + json.dumps(mooncake[0])]
    while len(out) < n:
        lines = copy.deepcopy(rng.choice((ours, mooncake)))
        k = rng.randrange(len(lines))
        key = rng.choice([*lines[k], "unknown_key"])
        if rng.random() < 0.85:
            lines[k][key] = rng.choice(BAD_VALUES)
        elif key in lines[k]:
            del lines[k][key]
        out.append("\n".join(json.dumps(line) for line in lines) + "\n")
    return out[:n]


TRACES = trace_corpus(random.Random("trace"), CORPUS)


@pytest.mark.parametrize("i", range(len(TRACES)))
def test_simulate_trace_takes_any_trace(tmp_path, capsys, i):
    path = _write(tmp_path, i, TRACES[i], ".jsonl")
    status, err = _run(capsys, ["simulate", "--trace", str(path), "--no-progress"])
    _assert_clean(status, err, TRACES[i][:300])


# ---- report ----

@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[str]:
    """The corpus, from a real simulate result: one run of a few requests."""
    out = tmp_path_factory.mktemp("base") / "result.json"
    assert main(["simulate", "--scenario", "quickstart", "--requests", "8", "--runs", "A",
                 "--no-progress", "--json", str(out)]) == 0
    return json_corpus(json.loads(out.read_text()), random.Random("report"), CORPUS)


@pytest.mark.parametrize("i", range(CORPUS))
def test_report_takes_any_result_file(tmp_path, capsys, monkeypatch, reports, i):
    monkeypatch.setattr(report, "DPI", 8)  # the same drawing, a few pixels to write
    path = _write(tmp_path, i, reports[i], ".json")
    status, err = _run(capsys, ["report", str(path), "--out", str(tmp_path / "out")])
    _assert_clean(status, err, reports[i][:300])


# ---- doctor --url ----

SCRAPE_VALUES = ("NaN", "+Inf", "-Inf", "1e308", "-1e308", "1e400", "-1", "0", "9" * 400,
                 "abc", "", "0x10", "1_000", "-0", "+1e-400")


def ours_text() -> str:
    """What our own server's /metrics says with nothing served yet."""
    return ServerMetrics("m").render().decode()


# a real vLLM 0.32.0 scrape under load: rejections and the queue by reason, ITL and TPOT
VLLM_LOADED = Path(__file__).parent / "fixtures" / "vllm-0.32.0" / "metrics_load_6.txt"


def scrape_corpus(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(first scrape, second scrape) pairs: the second a mutated copy of the first."""
    bases = [rising_vllm_texts()[0], ours_text(), VLLM_LOADED.read_text()]
    out = [(bases[0], ""), (bases[0], "\x00\xff garbage"), (bases[1], "\n" * 2_000_000),
           (bases[0], "x" * 5_000_000), (bases[0], "# TYPE a histogram\na_bucket{le=} 1")]
    while len(out) < n:
        base = rng.choice(bases)
        lines = base.splitlines()
        samples = [k for k, line in enumerate(lines) if line and not line.startswith("#")]
        for _ in range(rng.randint(1, 4)):
            k = rng.choice(samples)
            name, _, _ = lines[k].rpartition(" ")
            kind = rng.random()
            if kind < 0.6:
                lines[k] = f"{name} {rng.choice(SCRAPE_VALUES)}"
            elif kind < 0.7:
                lines[k] = lines[k].replace('"', "", 1)
            elif kind < 0.8:
                lines[k] = lines[k].replace('le="', 'le="NaN', 1) if "le=" in lines[k] \
                    else name + "{le=\"x\"} 1"
            elif kind < 0.9:
                lines.insert(k, lines[k])
            else:
                lines[k] = ""
        out.append((base, "\n".join(lines) + "\n"))
    return out[:n]


SCRAPES = scrape_corpus(random.Random("scrape"), CORPUS)


@pytest.mark.parametrize("i", range(len(SCRAPES)))
def test_doctor_url_takes_any_scrape(capsys, i):
    first, second = SCRAPES[i]
    with metrics_server([first, second]) as url:
        status, err = _run(capsys, ["doctor", "--url", url, "--window-s", "0.02",
                                    "--interval-s", "0.01", *(["--json"] if i % 2 else [])])
    _assert_clean(status, err, second[:300])
    if status == 0 and i % 2:
        json.loads(capsys.readouterr().out or "{}")
