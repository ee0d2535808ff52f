"""ShareGPT-style datasets: (prompt, output) lengths counted, filtered as vLLM filters
them, sampled jointly; the YAML `sharegpt:` class; clear errors for bad files."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from stepserve.workload.arrivals import Poisson
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import workload_from_dict, workload_to_dict
from stepserve.workload.sharegpt import MAX_PROMPT_LEN, load_sharegpt, sharegpt_class
from stepserve.workload.spec import Workload


def _conv(prompt: str, answer: str, keys=("from", "value")) -> dict:
    f, v = keys
    return {"id": "x", "conversations": [{f: "human", v: prompt}, {f: "gpt", v: answer}]}


DATA = [
    _conv("a" * 40, "b" * 400),  # 10 / 100 tokens by the 4-characters estimate
    _conv("c" * 800, "d" * 80),  # 200 / 20
    _conv("e" * 120, "f" * 1200, keys=("role", "content")),  # 30 / 300
    {"id": "one turn", "conversations": [{"from": "human", "value": "hi there friend"}]},
    _conv("hi", "a long enough answer"),  # prompt under 4 tokens
    _conv("g" * 4 * (MAX_PROMPT_LEN + 1), "h" * 40),  # prompt too long
    "not a conversation",
]


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(DATA))
    return path


def test_lengths_by_estimate_and_what_was_dropped(dataset):
    data = load_sharegpt(dataset)
    assert data.pairs == ((10, 100), (200, 20), (30, 300))
    assert data.dropped == {"without two turns": 2, "under 4 tokens": 1,
                            "over 1024 prompt / 2048 total tokens": 1}
    assert "estimate (4 characters per token" in data.describe()
    assert load_sharegpt(dataset, output_len=7).pairs == ((10, 7), (200, 7), (30, 7))


def test_a_tokenizer_counts_exactly(tmp_path):
    from stepserve.model.presets import resolve_model
    from stepserve.model.tokenizer import Tokenizer

    prompt, answer = "The cat sat on the mat. " * 3, "And then it went to sleep. " * 4
    path = tmp_path / "t.json"
    path.write_text(json.dumps([_conv(prompt, answer)]))
    tok = Tokenizer(resolve_model("tiny"))
    want = (len(tok.encode(prompt, add_special_tokens=False)),
            len(tok.encode(answer, add_special_tokens=False)))
    data = load_sharegpt(path, tokenizer="tiny")
    assert data.pairs == (want,) and data.counted_by == "tokenizer tiny"
    assert want != load_sharegpt(path).pairs[0]  # the estimate is only an estimate


def test_pairs_are_sampled_jointly_and_reproducibly(dataset):
    cls = sharegpt_class(dataset)
    workload = Workload("sg", (cls,), Poisson(10.0), 300, seed=3)
    specs = workload.generate()
    seen = Counter((s.prompt_len, s.output_len) for s in specs)
    assert set(seen) == {(10, 100), (200, 20), (30, 300)}  # never a mixed pair
    assert min(seen.values()) > 60  # uniform over the three
    assert [(s.prompt_len, s.output_len) for s in workload.generate()] == \
        [(s.prompt_len, s.output_len) for s in specs]
    assert all(s.max_tokens == s.output_len for s in specs)
    assert "pairs sampled jointly from sharegpt" in workload.describe()


def test_yaml_class_and_round_trip(dataset, tmp_path):
    data = {"name": "w", "num_requests": 20, "arrival": {"poisson": {"rate": 2}},
            "classes": [{"name": "real", "sharegpt": {"file": dataset.name,
                                                      "output_len": 16}},
                        {"name": "synthetic", "prompt": {"fixed": 5},
                         "output": {"fixed": 5}}]}
    workload = workload_from_dict(data, base_dir=tmp_path)
    real = workload.classes[0]
    assert real.pairs == ((10, 16), (200, 16), (30, 16))
    again = workload_from_dict(workload_to_dict(workload))
    assert again.classes[0].pairs == real.pairs
    assert workload_to_dict(workload)["classes"][0]["sharegpt"]["output_len"] == 16


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"conversations": []}', "expected a JSON list of conversations"),
    ("[]", "no usable conversation (it is empty)"),
    (json.dumps([_conv("hi", "yo")]), "no usable conversation (1 under 4 tokens)"),
])
def test_bad_files_say_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_sharegpt(path)


def test_bad_class_and_missing_file(tmp_path, dataset):
    with pytest.raises(WorkloadError, match="cannot be read"):
        load_sharegpt(tmp_path / "missing.json")
    with pytest.raises(WorkloadError, match="'prompt' and 'sharegpt' exclude each other"):
        workload_from_dict({"num_requests": 1, "arrival": {"poisson": {"rate": 1}},
                            "classes": [{"name": "x", "sharegpt": str(dataset),
                                         "prompt": {"fixed": 3}}]})
    with pytest.raises(WorkloadError, match="unknown key 'tokeniser'"):
        workload_from_dict({"num_requests": 1, "arrival": {"poisson": {"rate": 1}},
                            "classes": [{"name": "x", "sharegpt": {"file": str(dataset),
                                                                   "tokeniser": "tiny"}}]})
    with pytest.raises(WorkloadError, match="tokenizer 'nope'"):
        load_sharegpt(dataset, tokenizer="nope")
