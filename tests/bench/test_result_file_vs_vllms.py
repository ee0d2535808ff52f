"""Our `--save-result --save-detailed` file beside the one `vllm bench serve` 0.32.0
itself wrote (captured, tests/fixtures/vllm-0.32.0): the same keys in the same order,
each value of the same kind, per-request lists one entry per request."""

from __future__ import annotations

import json
from pathlib import Path

from stepserve.cli import main

VLLM_RESULT = Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0" / \
    "bench_serve_result_detailed.json"
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
               "latencies", "queue_times", "start_times")


def kind(value) -> str:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else type(value).__name__


def test_our_result_file_has_the_keys_of_vllms_own(served, tmp_path):
    theirs = json.loads(VLLM_RESULT.read_text())
    assert main(["bench", "--base-url", served.url, "--dataset-name", "random",
                 "--random-input-len", "8", "--random-output-len", "4", "--num-prompts", "6",
                 "--max-concurrency", "3", "--save-result", "--save-detailed",
                 "--result-dir", str(tmp_path), "--result-filename", "ours.json",
                 "--no-progress"]) == 0
    ours = json.loads((tmp_path / "ours.json").read_text())
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        if value is not None and ours[key] is not None:
            assert kind(ours[key]) == kind(value), key
    for key in PER_REQUEST:
        assert len(ours[key]) == ours["num_prompts"] == 6, key
        assert len(theirs[key]) == theirs["num_prompts"] == 48, key
