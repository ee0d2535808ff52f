"""The prefix cache in `stepserve bench`: vLLM's prefix_repetition dataset (each knob
changes the prompts), prompts that share nothing by accident, and the hit rate and
repeated share in the bench's summary (the hit rate only from answers that count their
cached tokens)."""

from __future__ import annotations

import argparse
import json

import pytest

from stepserve.bench.client import RequestRecord, _take_event
from stepserve.bench.prompt_maker import PromptMaker, repeated_tokens, token_prompt
from stepserve.bench.results import format_table, summarize_records
from stepserve.bench.workload_options import build_workload, make_specs
from stepserve.cli import main
from stepserve.cli.bench import add_bench_parser, bench_options
from stepserve.workload.spec import RequestSpec

PREFIX = ["--dataset-name", "prefix_repetition", "--num-prompts", "40"]
SMALL = ["--prefix-repetition-prefix-len", "32", "--prefix-repetition-suffix-len", "16",
         "--prefix-repetition-num-prefixes", "4", "--prefix-repetition-output-len", "2"]


def _specs(*flags: str) -> list[RequestSpec]:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    options = bench_options(parser.parse_args(["bench", "--sim", *flags])).workload
    return make_specs(options, build_workload(options))


def _prompts(specs: list[RequestSpec]) -> list[tuple[int, ...]]:
    return [tuple(token_prompt(s)) for s in specs]


def test_prefix_repetition_deals_each_prefix_to_an_even_share_of_the_prompts():
    specs = _specs(*PREFIX, *SMALL)
    assert len(specs) == 40
    by_prefix: dict[str, list[tuple[int, ...]]] = {}
    for spec, ids in zip(specs, _prompts(specs), strict=True):
        assert spec.prompt_len == len(ids) == 48 and spec.max_tokens == 2
        by_prefix.setdefault(spec.prefix, []).append(ids)
    assert sorted(len(v) for v in by_prefix.values()) == [10, 10, 10, 10]
    for group in by_prefix.values():
        assert len({ids[:32] for ids in group}) == 1  # the prefix, shared
        assert len({ids[32:] for ids in group}) == len(group)  # each its own suffix
    assert len({group[0][:32] for group in by_prefix.values()}) == 4


@pytest.mark.parametrize("flag, value", [
    ("--prefix-repetition-prefix-len", "48"), ("--prefix-repetition-suffix-len", "8"),
    ("--prefix-repetition-num-prefixes", "5"), ("--prefix-repetition-output-len", "3"),
])
def test_every_prefix_repetition_knob_changes_the_requests(flag, value):
    """What each request sends: its prompt and its max_tokens (the output length)."""
    def sent(specs):
        return [(ids, s.max_tokens) for ids, s in zip(_prompts(specs), specs, strict=True)]

    flags = list(SMALL)
    flags[flags.index(flag) + 1] = value
    assert sent(_specs(*PREFIX, *flags)) != sent(_specs(*PREFIX, *SMALL))


@pytest.mark.parametrize("flags, message", [
    (["--prefix-repetition-num-prefixes", "0"], "--prefix-repetition-num-prefixes"),
    (["--prefix-repetition-prefix-len", "0"], "--prefix-repetition-prefix-len"),
    (["--prefix-repetition-num-prefixes", "41"], "at most --num-prompts (40)"),
    (["--prefix-repetition-suffix-len", "-3"], "--prefix-repetition-suffix-len"),
])
def test_bad_prefix_repetition_knobs_are_one_line_errors(flags, message, capsys):
    assert main(["bench", "--sim", *PREFIX, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_prefix_repetition_knob_without_the_dataset_is_refused(capsys):
    assert main(["bench", "--sim", "--prefix-repetition-prefix-len", "8"]) == 2
    assert "goes with --dataset-name prefix_repetition" in capsys.readouterr().err


def test_random_token_prompts_share_no_first_block():
    """The old prompts (one formula of the index over a 490-id span) came round every
    490 requests: a server's prefix cache would hit where no one shares anything."""
    firsts = {tuple(token_prompt(RequestSpec(i, 0.0, 64, 1, 1))[:16]) for i in range(5000)}
    assert len(firsts) == 5000
    words = PromptMaker()
    first_words = {words(RequestSpec(i, 0.0, 16, 1, 1)) for i in range(5000)}
    assert len(first_words) == 5000


def test_the_repeated_share_counts_a_prefix_from_its_second_prompt_in_whole_blocks():
    specs = [RequestSpec(i, float(i), 60, 1, 1, prefix=f"p/{i % 2}", prefix_len=40)
             for i in range(4)]
    assert repeated_tokens(specs) == [0, 0, 32, 32]  # 40 tokens: two whole 16-token blocks


def _record(cached: int | None, repeated: int | None = 0) -> RequestRecord:
    return RequestRecord(index=0, prompt_len=100, send_s=0.0, end_s=1.0,
                         chunk_times_s=[0.5], prompt_tokens=100, finish_reason="length",
                         cached_tokens=cached, repeated_tokens=repeated)


def test_the_hit_rate_comes_from_usage_and_is_absent_when_the_server_does_not_say():
    told = summarize_records([_record(64, 64), _record(0, 0)])
    assert told.prefix_cache_hit_rate == 0.32 and told.prefix_repeated_share == 0.32
    assert [line.split() for line in format_table("x", told).splitlines()
            if line.startswith("prefix_")] == [["prefix_cache_hit_rate", "32.0%"],
                                               ["prefix_repeated_share", "32.0%"]]
    silent = summarize_records([_record(None), _record(None)])
    assert "prefix_cache_hit_rate" not in silent.to_json()
    assert silent.prefix_repeated_share == 0.0


def test_the_client_reads_cached_tokens_from_the_usage_chunk():
    rec = RequestRecord(index=0)
    _take_event(rec, json.dumps({"choices": [], "usage": {
        "prompt_tokens": 80, "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 48}}}), 1.0)
    assert (rec.prompt_tokens, rec.cached_tokens) == (80, 48)
    bare = RequestRecord(index=0)
    _take_event(bare, json.dumps({"choices": [], "usage": {"prompt_tokens": 80}}), 1.0)
    assert bare.cached_tokens is None


def test_bench_sim_on_prefix_repetition_reports_hits_and_random_reports_none(tmp_path):
    out = tmp_path / "p.json"
    assert main(["bench", "--sim", *PREFIX, *SMALL, "--max-concurrency", "2",
                 "--no-progress", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["runs"][0]["summary"]
    assert summary["prefix_repeated_share"] == pytest.approx(36 * 32 / (40 * 48))
    assert 0 < summary["prefix_cache_hit_rate"] <= summary["prefix_repeated_share"]
    plain = tmp_path / "r.json"
    assert main(["bench", "--sim", "--random-input-len", "48", "--random-output-len", "2",
                 "--num-prompts", "40", "--no-progress", "--json", str(plain)]) == 0
    summary = json.loads(plain.read_text())["runs"][0]["summary"]
    assert summary["prefix_cache_hit_rate"] == summary["prefix_repeated_share"] == 0.0
