"""The default model in its default mode (q4_1: the GGUF's own Q4_1/Q8_0 groups through
the stepserve kernels) against transformers on the float32 weights those groups
dequantise to: greedy tokens equal, prefill chunks mixed with decodes. Slow: loads the
default model and runs the reference (~20 s)."""

from __future__ import annotations

import pytest

from stepserve.model.runner import TorchRunner
from stepserve.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is",
    "Hi",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_default_mode_is_q4_1_and_matches_transformers(default_dir, driver, reference):
    runner = TorchRunner("default", block_size=16, num_gpu_blocks=128)
    assert runner.quantization == "q4_1"
    assert runner.weight_bytes < 100e6  # vs 538 MB of float32
    tok = Tokenizer(default_dir)
    prompts = [tok.encode(t) for t in TEXTS] + [tok.encode_chat(CHAT)]
    got = driver(runner, prompts, 16, chunk=7, admit_per_step=2)
    want = reference(default_dir, prompts, 16)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"prompt {i}: {tok.decode(g)!r} != {tok.decode(w)!r}"
    assert "Paris" in tok.decode(got[0])
