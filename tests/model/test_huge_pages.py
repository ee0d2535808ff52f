"""The GGUF weights moved into one huge-page arena (weights.py): the same values, the
tied table still shared, every kernel pointer inside the arena, the same tokens."""

from __future__ import annotations

import sys

import pytest
import torch

from stepserve.model import weights
from stepserve.model.ggml_kernels import FMT_F32, kernels_unavailable_reason
from stepserve.model.quant import GGUFEmbedding, GGUFLinear
from stepserve.model.runner import TorchRunner
from stepserve.model.weights import ALIGN, move_to_huge_pages

pytestmark = [
    pytest.mark.skipif(kernels_unavailable_reason() is not None,
                       reason=str(kernels_unavailable_reason())),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
]
pytest.importorskip("gguf")


def runner(gguf_dir) -> TorchRunner:
    return TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=64, quantization="q4_1")


def gguf_modules(model):
    return [m for m in model.modules() if isinstance(m, (GGUFLinear, GGUFEmbedding))]


def test_every_quantised_buffer_lives_in_one_aligned_arena(gguf_dir):
    model = runner(gguf_dir).model
    tensors = {t.data_ptr(): t for m in gguf_modules(model) for t in (m.qs, m.scales)}
    starts = sorted(tensors)
    end = starts[-1] + tensors[starts[-1]].nbytes
    total = sum(t.nbytes for t in tensors.values())
    assert end - starts[0] < total + ALIGN * len(tensors)  # one mapping, packed
    assert all(p % ALIGN == 0 for p in starts)
    if model.packed_head is not None:  # the tied table: one copy, two readers
        assert model.packed_head.qs.data_ptr() == model.embed_tokens.qs.data_ptr()
    words = model.fused_decode.layers.view(-1, 14).tolist()  # decode_kernels.c's layout
    pointers = [w[3 + 3 * j + i] for w in words for j in range(4) if w[2 + 3 * j] != FMT_F32
                for i in (0, 1)]  # each quantised projection's quants and scales
    assert pointers and all(starts[0] <= p < end for p in pointers)


def test_values_and_greedy_tokens_are_unchanged(gguf_dir, driver, monkeypatch):
    moved = runner(gguf_dir)
    monkeypatch.setattr(weights, "move_to_huge_pages", lambda model: 0)
    kept = runner(gguf_dir)
    for a, b in zip(gguf_modules(moved.model), gguf_modules(kept.model)):
        assert a.qs.data_ptr() != b.qs.data_ptr()
        assert torch.equal(a.qs, b.qs) and torch.equal(a.scales, b.scales)
    prompts = [[5, 9, 300, 41], list(range(3, 40))]
    assert driver(moved, prompts, 10, chunk=8) == driver(kept, prompts, 10, chunk=8)


def test_a_model_without_gguf_buffers_is_left_alone(tiny_dir):
    model = TorchRunner(tiny_dir, num_gpu_blocks=16, quantization="none").model
    assert move_to_huge_pages(model) == 0
