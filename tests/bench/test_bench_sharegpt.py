"""`stepserve bench --sharegpt FILE`: a ShareGPT-style dataset's lengths, sent to our
server and through the simulator; the server counts exactly the prompt tokens the
dataset gave."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main
from stepserve.workload.sharegpt import load_sharegpt


@pytest.fixture
def dataset(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": "q" * (4 * n)},
                                {"from": "gpt", "value": "a" * (4 * m)}]}
             for n, m in ((12, 6), (40, 10), (25, 4), (60, 8))]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    return path


def _summary(tmp_path, *argv) -> dict:
    out = tmp_path / "r.json"
    assert main(["bench", *argv, "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())["runs"][0]["summary"]


def test_sharegpt_against_our_server_and_the_sim(served, dataset, tmp_path, capsys):
    served.wait_idle()
    before = served.metrics()["stepserve:prompt_tokens_total"]
    # token ids of exactly the counted lengths; every output to its length
    same = ["--ignore-eos", "--num-prompts", "10", "--max-concurrency", "4", "--seed", "1"]
    live = _summary(tmp_path, "--target", served.url, "--sharegpt", str(dataset),
                    "--token-id-prompts", *same)
    sent = served.metrics()["stepserve:prompt_tokens_total"] - before
    assert "pairs sampled jointly from sharegpt" in capsys.readouterr().err
    pairs = set(load_sharegpt(dataset).pairs)
    assert live["requests_finished"] == 10 and live["prompt_tokens"] == sent
    sim = _summary(tmp_path, "--sim", "--cost", "constant", "--sharegpt", str(dataset),
                   *same)
    # the same seed draws the same pairs: same prompt and output token totals
    assert (sim["prompt_tokens"], sim["output_tokens"]) == \
        (live["prompt_tokens"], live["output_tokens"])
    assert live["output_tokens"] in range(10 * min(o for _, o in pairs),
                                          10 * max(o for _, o in pairs) + 1)


def test_sharegpt_flags_and_bad_files(dataset, tmp_path, capsys):
    assert main(["bench", "--sim", "--sharegpt", str(dataset), "--random-input-len", "3",
                 "--random-output-len", "3"]) == 2
    assert "give one workload" in capsys.readouterr().err
    assert main(["bench", "--sim", "--random-input-len", "3", "--random-output-len", "3",
                 "--sharegpt-output-len", "4"]) == 2
    assert "--sharegpt-output-len goes with --dataset-path" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"conversations\": 3}]")
    assert main(["bench", "--sim", "--sharegpt", str(bad)]) == 2
    assert "no usable conversation (1 without two turns)" in capsys.readouterr().err
