"""benchmarks/prefix_cache.py's loads and table (the servers themselves are its run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import prefix_cache  # noqa: E402
from engine_vs_llamacpp import Cell  # noqa: E402


def args(**changes) -> argparse.Namespace:
    base = dict(concurrency=[8, 32], num_prompts=64, prefix_len=1000, suffix_len=100,
                num_prefixes=8, output_len=64)
    return argparse.Namespace(**{**base, **changes})


def test_each_load_has_its_own_seed_and_the_control_the_same_length():
    loads = prefix_cache.loads(args())
    assert [load.name for load in loads] == ["shared c=8", "shared c=32", "control c=8"]
    seeds = [load.bench_args[load.bench_args.index("--seed") + 1] for load in loads]
    assert len(set(seeds)) == 3
    control = loads[-1].bench_args
    assert control[control.index("--random-input-len") + 1] == "1100"
    shared = loads[0].bench_args
    assert shared[shared.index("--prefix-repetition-num-prefixes") + 1] == "8"


def test_table_shows_hit_rate_and_on_off_ratios():
    on = {"throughput_tokens_per_s": 200.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.5,
          "tpot_p50_s": 0.03, "tpot_p99_s": 0.05, "prefix_cache_hit_rate": 0.85}
    off = {**on, "throughput_tokens_per_s": 100.0, "ttft_p50_s": 1.0,
           "prefix_cache_hit_rate": None}
    text = prefix_cache.format_table([Cell("caching on", "shared c=8", on, 1.0),
                                      Cell("caching off", "shared c=8", off, 1.0)],
                                     ["shared c=8"])
    rows = text.splitlines()
    assert "85.0" in rows[2] and rows[3].split()[-1] == "-"
    ratio_row = rows[4].split()
    assert ratio_row[:3] == ["on", "/", "off"] and ratio_row[3:5] == ["2.00x", "0.10x"]


def test_table_sets_caching_on_against_llama_cpp():
    on = {"throughput_tokens_per_s": 60.0, "ttft_p50_s": 0.6, "ttft_p99_s": 13.0,
          "tpot_p50_s": 0.09, "tpot_p99_s": 0.2, "prefix_cache_hit_rate": 0.79}
    llama = {**on, "throughput_tokens_per_s": 30.0, "ttft_p50_s": 2.4,
             "prefix_cache_hit_rate": None}
    text = prefix_cache.format_table([Cell("caching on", "shared c=8", on, 1.0),
                                      Cell("llama.cpp", "shared c=8", llama, 1.0)],
                                     ["shared c=8"])
    ratio_row = text.splitlines()[4].split()
    assert ratio_row[:3] == ["on", "/", "llama.cpp"] and ratio_row[3:5] == ["2.00x", "0.25x"]


def test_an_unknown_server_is_refused_with_what_is_allowed(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["prefix_cache.py", "--servers", "on,vllm"])
    assert prefix_cache.main() == 2
    err = capsys.readouterr().err
    assert "unknown vllm" in err and "allowed: on, off, llama.cpp" in err
