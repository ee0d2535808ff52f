"""A ShareGPT file whose text is not valid Unicode (a lone surrogate, `\\ud800` in its
JSON) is refused naming the file, the conversation and the turn, whether its lengths are
counted by a tokenizer (which cannot take the text) or estimated (which would hide it);
`stepserve bench` says so in one line with exit 2."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main
from stepserve.workload.errors import WorkloadError
from stepserve.workload.sharegpt import load_sharegpt


def conversation(prompt: str, answer: str) -> dict:
    return {"conversations": [{"from": "human", "value": prompt},
                              {"from": "gpt", "value": answer}]}


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "sg.json"
    good = conversation("a fine question to ask", "and a fine answer to it")
    path.write_text(json.dumps([good, good, conversation(
        "a fine question", "an answer with a broken \ud800 character in it")]))
    return path


@pytest.mark.parametrize("tokenizer", [None, "tiny"])
def test_a_lone_surrogate_is_an_error_naming_conversation_and_turn(bad_file, tokenizer):
    with pytest.raises(WorkloadError) as info:
        load_sharegpt(bad_file, tokenizer)
    message = str(info.value)
    assert str(bad_file) in message and "conversation 2, its completion turn" in message
    assert "lone surrogate (U+D800)" in message


def test_valid_non_ascii_text_is_counted(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([conversation("¿qué tal? \U0001F600 " * 3, "très bien " * 4)]))
    assert len(load_sharegpt(path, "tiny").pairs) == 1


def test_bench_refuses_the_file_in_one_line(bad_file, capsys):
    argv = ["bench", "--sim", "--dataset-name", "sharegpt", "--dataset-path", str(bad_file),
            "--num-prompts", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "surrogate" in err, err


def test_a_workload_class_drawing_from_the_file_is_refused(bad_file, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(f"num_requests: 4\narrival: {{poisson: {{rate: 5}}}}\nclasses:\n"
                        f"  - name: chat\n    share: 1.0\n"
                        f"    sharegpt: {{file: {bad_file}, tokenizer: tiny}}\n")
    assert main(["bench", "--sim", "--workload", str(workload)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "classes[0]" in err and "surrogate" in err, err
