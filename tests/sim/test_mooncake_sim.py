"""A Mooncake trace in the simulator: prompts whose hash ids agree share KV blocks in the
engine's own prefix cache, block for block as far as they agree (the trace's 512-token
blocks and the engine's 16-token ones independent), and `stepserve simulate --trace`
replays one with a hit rate that follows its hash ids."""

from __future__ import annotations

import json
from pathlib import Path

from stepserve.cli import main
from stepserve.config.settings import EngineConfig
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.trace import load_mooncake_trace

SAMPLE = Path(__file__).parents[2] / "benchmarks" / "workloads" / "mooncake_sample.jsonl"
KV_BLOCK = 16


def _trace(tmp_path: Path, *lines: tuple[int, int, list[int]]) -> Path:
    """(timestamp ms, input_length, hash_ids) per line, 4 output tokens each."""
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4,
                                     "hash_ids": h}) + "\n" for t, n, h in lines))
    return p


def _cached(path: Path) -> list[int]:
    specs = load_mooncake_trace(path).specs
    config = EngineConfig().replace(block_size=KV_BLOCK, max_model_len=4096)
    sim = simulate(config, specs, ConstantCost(), num_gpu_blocks=1024)
    return [r.num_cached_tokens for r in sorted(sim.requests, key=lambda r: int(r.request_id))]


def test_a_repeated_prompt_hits_every_full_kv_block_of_the_shared_part(tmp_path):
    # the second arrives long after the first ended: its blocks are cached, not in flight
    p = _trace(tmp_path, (0, 1000, [1, 2]), (60_000, 1000, [1, 2]))
    assert _cached(p) == [0, 1000 // KV_BLOCK * KV_BLOCK]  # 62 blocks: 992 tokens


def test_prompts_share_blocks_as_far_as_their_hash_ids_agree(tmp_path):
    p = _trace(tmp_path, (0, 1500, [1, 2, 3]), (60_000, 1500, [1, 2, 4]),
               (120_000, 1500, [5, 2, 3]), (180_000, 700, [1, 2]))
    # 2 shared trace blocks; none (a different first block); the first 700 tokens of
    # the first prompt, all but the last token (699) in whole KV blocks
    assert _cached(p) == [0, 1024, 0, 688]


def test_simulate_replays_a_mooncake_trace_with_prefix_hits(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["simulate", "--trace", str(SAMPLE), "--cost", "constant", "--no-progress",
                 "--trace-slowdown", "2", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["runs"][0]["summary"]
    assert summary["requests_finished"] == 200
    assert 0.2 < summary["prefix_cache_hit_rate"] <= summary["prefix_repeated_share"]


def test_simulate_refuses_a_bad_trace_in_one_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, '
                 '"hash_ids": [1, 2, 3]}\n')
    assert main(["simulate", "--trace", str(p), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "line 1: hash_ids = [1, 2, 3]: 3 ids; at most 2" in err
