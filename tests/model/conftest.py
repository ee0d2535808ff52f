"""Fixtures for the model tests: a tiny model directory, a hand-written scheduling loop
that drives `TorchRunner` (chunked prefill mixed with decodes), and the transformers
reference.

The loop plays the scheduler's part by hand, as STYLE.md asks: allocate slots, build
`SchedulerOutput`s, then advance `num_computed_tokens` and append sampled tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from factories import batch, kv_manager

from stepserve.core.request import Request, SamplingParams

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in these tests may download


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from stepserve.model.presets import resolve_model

    return resolve_model("tiny", cache=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def gguf_dir(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model as a GGUF and its float32 reference directory (tests/tiny_gguf.py)."""
    pytest.importorskip("gguf")
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tiny_dir, tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def default_dir() -> Path:
    """The converted SmolLM2 in the user's cache (converted on first use, ~30 s)."""
    from stepserve.model.presets import resolve_model

    return resolve_model("default")


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def drive(runner, prompts: list[list[int]], max_new_tokens: int, chunk: int = 7,
          admit_per_step: int = 2, params: list[SamplingParams] | None = None,
          on_step=None) -> list[list[int]]:
    """Run every prompt to `max_new_tokens` output tokens. `admit_per_step` new requests
    join each step, prompts are fed `chunk` tokens at a time, and everything running
    shares each step, so prefill chunks and decodes mix in one batch."""
    mgr = kv_manager(runner)
    reqs = [Request(f"r{i}", list(p), params[i] if params else greedy(max_new_tokens), 0.0)
            for i, p in enumerate(prompts)]
    running: list[Request] = []
    waiting = list(reqs)
    step = 0
    while running or waiting:
        running += waiting[:admit_per_step]
        del waiting[:admit_per_step]
        counts = [min(chunk, r.num_tokens - r.num_computed_tokens) for r in running]
        for r, n in zip(running, counts, strict=True):
            assert mgr.allocate_slots(r, n), "test KV cache too small"
        out = runner.execute(batch(step, running, counts, mgr))
        if on_step is not None:
            on_step(step, running, counts, out)
        for r, n, tok in zip(list(running), counts, out.sampled_token_ids, strict=True):
            assert (tok is None) == (r.num_computed_tokens + n < r.num_tokens)
            r.num_computed_tokens += n
            if tok is not None:
                r.output_token_ids.append(tok)
            if r.num_output_tokens == r.sampling_params.max_tokens:
                mgr.free(r)
                running.remove(r)
        step += 1
    mgr.check_integrity()
    assert mgr.all_free
    return [r.output_token_ids for r in reqs]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time, EOS ignored."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # neither stop at EOS nor suppress it
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
            assert len(out[-1]) == max_new_tokens
    return out


@pytest.fixture(scope="session")
def driver():
    return drive


@pytest.fixture(scope="session")
def reference():
    return hf_greedy
