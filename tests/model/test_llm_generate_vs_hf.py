"""LLM.generate (the whole engine: scheduler + KV manager + TorchRunner) against Hugging
Face transformers' greedy generate, one prompt at a time, on the same weights: token for
token, under every batching mode and both preemption modes (the engine's correctness
reference).
Where a model has a GGUF source (the default model; the tiny GGUF written here) the engine
runs the GGUF's own Q4_1/Q8_0 groups (quantization "auto" = q4_1) and the reference is
transformers on the float32 weights those groups dequantise to."""

from __future__ import annotations

import random

import pytest

from stepserve.core.request import SamplingParams

NEW_TOKENS = 12
CASES = {
    # name: settings; chunking small enough that prompts really split
    "continuous-chunked": dict(max_num_batched_tokens=16, long_prefill_token_threshold=8,
                               max_num_partial_prefills=2, max_long_partial_prefills=2),
    # so few blocks that sequences must be evicted and recomputed
    "recompute": dict(block_size=4, num_gpu_blocks=40, preemption_mode="recompute",
                      max_num_batched_tokens=64, long_prefill_token_threshold=16),
    "swap": dict(block_size=4, num_gpu_blocks=40, num_cpu_blocks=200, preemption_mode="swap",
                 max_num_batched_tokens=64, long_prefill_token_threshold=16),
    "static": dict(batching="static", max_num_seqs=6, max_num_batched_tokens=128),
    "dynamic": dict(batching="dynamic", max_num_seqs=5, batch_window_s=0.0,
                    max_num_batched_tokens=128),
}


def make_prompts(vocab: int, n: int = 16, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [3, 5, 9, 17, 30, 44, 60, 100] * (n // 8)
    return [[rng.randrange(4, vocab) for _ in range(k)] for k in lengths[:n]]


def run_case(model_dir, prompts, settings, quantization):
    from stepserve import LLM

    llm = LLM(str(model_dir), max_model_len=160, watermark=0.0, **settings)
    assert llm.engine.runner.quantization == quantization
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    kv = llm.scheduler.kv
    kv.check_integrity()
    assert kv.all_free
    finished = llm.scheduler.finished
    return [o.outputs[0].token_ids for o in outs], finished


def check_modes(model_dir, reference, quantization="none"):
    from stepserve.model.model_args import ModelArgs

    vocab = ModelArgs.from_dir(model_dir).vocab_size if hasattr(ModelArgs, "from_dir") \
        else 500
    prompts = make_prompts(min(vocab, 500))
    expected = reference(model_dir, prompts, NEW_TOKENS)
    for name, settings in CASES.items():
        got, finished = run_case(model_dir, prompts, settings, quantization)
        assert got == expected, f"{name}: outputs differ from transformers"
        if name == "recompute":
            assert sum(r.num_recomputed_tokens for r in finished) > 0, "no recompute happened"
        if name == "swap":
            assert sum(r.num_swapped_out_blocks for r in finished) > 0, "no swap happened"


def test_tiny_model_matches_transformers_in_every_mode(tiny_dir, reference):
    check_modes(tiny_dir, reference)


def auto_mode() -> str:
    """What quantization "auto" picks for a GGUF-sourced model on this machine."""
    from stepserve.model.ggml_kernels import kernels_unavailable_reason

    return "q4_1" if kernels_unavailable_reason() is None else "none"


def test_tiny_gguf_matches_transformers_in_every_mode(gguf_dir, reference):
    check_modes(gguf_dir, reference, quantization=auto_mode())


@pytest.mark.slow
def test_default_model_matches_transformers_in_every_mode(default_dir, reference):
    check_modes(default_dir, reference, quantization=auto_mode())
