"""`stepserve bench --dataset-name mooncake`: a Mooncake trace sent at its own times, with
prompts whose tokens follow the hash ids, so a real server's prefix cache serves the
repeated blocks; the repeated share worked out from the hash ids alone."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from stepserve.bench.prompt_maker import (
    PromptMaker,
    load_tokenizer,
    repeated_trace_tokens,
    token_prompt,
)
from stepserve.bench.workload_options import BenchError, build_workload, make_specs
from stepserve.cli import main
from stepserve.cli.bench import add_bench_parser, bench_options
from stepserve.workload.trace import load_mooncake_trace

BLOCK = 32  # trace tokens per hash id: the tiny model's max_model_len is 256
# (timestamp ms, input_length, hash_ids): the first prompt again, then a prompt sharing
# its first two blocks, then one of its own
LINES = [(0, 100, [1, 2, 3, 4]), (500, 100, [1, 2, 3, 4]), (1000, 80, [1, 2, 5]),
         (1500, 60, [6, 7])]
# whole 16-token blocks an earlier prompt began with, never a prompt's last token
REPEATED = [0, 96, 64, 0]


def _trace(tmp_path: Path) -> Path:
    p = tmp_path / "mooncake.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4,
                                     "hash_ids": h}) + "\n" for t, n, h in LINES))
    return p


def _options(*flags: str):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return bench_options(parser.parse_args(["bench", "--sim", *flags])).workload


def test_the_trace_is_sent_at_its_own_times_slowed_and_cut_by_num_prompts(tmp_path):
    o = _options("--dataset-name", "mooncake", "--dataset-path", str(_trace(tmp_path)),
                 "--trace-block-tokens", str(BLOCK), "--mooncake-slowdown-factor", "2")
    specs = make_specs(o, build_workload(o))
    assert [s.arrival_s for s in specs] == [0.0, 1.0, 2.0, 3.0]
    assert [s.max_tokens for s in specs] == [4] * 4
    o = _options("--dataset-name", "mooncake", "--dataset-path", str(_trace(tmp_path)),
                 "--trace-block-tokens", str(BLOCK), "--num-prompts", "2")
    assert len(make_specs(o, build_workload(o))) == 2


@pytest.mark.parametrize("flags, message", [
    (["--dataset-name", "mooncake"], "--dataset-name mooncake needs --dataset-path FILE"),
    (["--dataset-name", "mooncake", "--dataset-path", "t.jsonl", "--scenario",
      "night-report"], "give one workload"),
])
def test_a_mooncake_run_without_its_trace_or_with_another_workload_is_refused(flags, message):
    o = _options(*flags)
    with pytest.raises(BenchError, match=message):
        build_workload(o)


def test_the_load_flags_change_only_how_a_trace_is_sent(tmp_path):
    trace = ["--dataset-name", "mooncake", "--dataset-path", str(_trace(tmp_path)),
             "--trace-block-tokens", str(BLOCK)]
    o = _options(*trace, "--max-concurrency", "2")
    workload = build_workload(o)
    assert workload.closed_loop_concurrency == 2
    assert [s.hash_ids for s in make_specs(o, workload)] == [tuple(h) for _, _, h in LINES]
    o = _options(*trace, "--request-rate", "inf")
    assert [s.arrival_s for s in make_specs(o, build_workload(o))] == [0.0] * 4
    with pytest.raises(BenchError, match="--request-rate 5: a trace is sent at its own "
                                         "times"):
        build_workload(_options(*trace, "--request-rate", "5"))


def test_prompts_share_tokens_and_text_as_far_as_their_hash_ids_agree(tmp_path):
    specs = load_mooncake_trace(_trace(tmp_path), block_tokens=BLOCK).specs
    ids = [token_prompt(s, vocab=500) for s in specs]
    assert [len(i) for i in ids] == [100, 100, 80, 60]
    assert ids[0] == ids[1] and ids[2][:64] == ids[0][:64] and ids[2][64:96] != ids[0][64:96]
    assert ids[3][:32] != ids[0][:32]
    words = PromptMaker()
    texts = [words(s) for s in specs]
    assert texts[0] == texts[1] and len(texts[0].split()) == 100
    assert texts[2].split()[:64] == texts[0].split()[:64]
    assert repeated_trace_tokens(specs) == REPEATED


def test_the_repeated_share_follows_a_cut_block_and_arrival_order():
    from stepserve.workload.trace import TraceSpec

    def spec(i, t, n, h):
        return TraceSpec(i, t, n, 1, 1, hash_ids=tuple(h), block_tokens=BLOCK)

    # the earlier prompt had only 40 tokens of block 2: a later one shares those 40
    specs = [spec(0, 1.0, 100, [1, 2, 3, 4]), spec(1, 0.0, 40, [1, 2]),
             spec(2, 2.0, 100, [9, 2, 3, 4])]
    assert repeated_trace_tokens(specs) == [32, 0, 0]


def test_text_prompts_of_exact_length_with_the_tiny_tokenizer(tmp_path):
    tokenizer = load_tokenizer("tiny")
    specs = load_mooncake_trace(_trace(tmp_path), block_tokens=BLOCK).specs
    texts = [PromptMaker(tokenizer=tokenizer)(s) for s in specs]
    assert texts[0] == texts[1]
    first, third = (tokenizer.encode(t, add_special_tokens=False) for t in texts[::2])
    assert abs(len(first) - 100) <= 4  # a seam between blocks can merge a token
    assert first[:60] == third[:60]


@pytest.mark.parametrize("prompts", [["--token-id-prompts"], []], ids=["token-ids", "text"])
def test_bench_replays_a_trace_and_the_server_serves_the_repeated_blocks(
        served, tmp_path, capsys, prompts):
    served.wait_idle()
    out = tmp_path / "r.json"
    assert main(["bench", "--target", served.url, "--dataset-name", "mooncake",
                 "--dataset-path", str(_trace(tmp_path)), "--trace-block-tokens", str(BLOCK),
                 *prompts, "--no-progress", "--metrics-interval-s", "0",
                 "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    s = run["summary"]
    assert s["requests_finished"] == 4 and s["output_tokens"] == 16
    assert run["load"]["dataset"] == "mooncake"
    # over the prompt tokens the server counted: text may encode to a few more or fewer
    assert s["prefix_repeated_share"] == pytest.approx(sum(REPEATED) / 340,
                                                       rel=0.05 if not prompts else 1e-9)
    if prompts:  # token ids: the server serves exactly the repeated blocks
        assert s["prefix_cache_hit_rate"] == pytest.approx(s["prefix_repeated_share"])
    else:  # text: up to the seam where the prompts part
        assert s["prefix_cache_hit_rate"] > 0
    assert "trace " in capsys.readouterr().err  # sent at the trace's times, not at once
