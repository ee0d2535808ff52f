"""The decode rows of a mixed step (decodes beside a prefill chunk) attend through the
kernel library (decode_attention.c) instead of gathering their contexts for torch's SDPA:
the same hidden states and K/V as the torch path, windowed too, in every kernel build, and
the torch path's decode groups are never built when the kernel runs."""

from __future__ import annotations

import pytest
import torch

from stepserve.model.ggml_kernels import ISA_ENV, available_isas, kernels_unavailable_reason
from stepserve.model.paged_attention import build_attention_metadata
from stepserve.model.runner import TorchRunner

pytestmark = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                reason=str(kernels_unavailable_reason()))
pytest.importorskip("gguf")
BS = 4


def mixed_step(runner, ctx_lens, chunk, chunk_start, window=None, seed=0):
    """Random K/V in shuffled blocks; one decode per `ctx_lens` entry (its length, the new
    token included), then one prefill chunk of `chunk` tokens after `chunk_start`."""
    g = torch.Generator().manual_seed(seed)
    runner.kv.kv.copy_(torch.randn(runner.kv.kv.shape, generator=g))
    blocks = torch.randperm(runner.kv.num_blocks, generator=g).tolist()
    ends = [*ctx_lens, chunk_start + chunk]
    tables = []
    for n in ends:
        need = -(-n // BS)
        tables.append(blocks[:need])
        del blocks[:need]
    meta, positions = build_attention_metadata(
        [n - 1 for n in ctx_lens] + [chunk_start], [1] * len(ctx_lens) + [chunk], tables, BS,
        torch.device("cpu"), window, num_decode=len(ctx_lens))
    ids = torch.randint(3, 500, (len(ctx_lens) + chunk,), generator=g)
    return meta, positions, ids


@pytest.mark.parametrize("isa", available_isas())
@pytest.mark.parametrize("ctx_lens,chunk,start,window", [
    ([5, 17, 2, 40], 7, 0, None), ([33, 9, 12], 5, 11, None), ([33, 9, 12], 9, 20, 6),
    ([1], 3, 0, None)])
def test_kernel_decode_rows_equal_the_torch_path(gguf_dir, isa, ctx_lens, chunk, start,
                                                 window, monkeypatch):
    monkeypatch.setenv(ISA_ENV, isa)
    runner = TorchRunner(gguf_dir, block_size=BS, num_gpu_blocks=160, quantization="q4_1")
    model, fused = runner.model, runner.model.fused_decode
    assert fused is not None and fused.kernels.isa == isa
    fused.window = window or 0
    meta, positions, ids = mixed_step(runner, ctx_lens, chunk, start, window)
    kv_before = runner.kv.kv.clone()
    with torch.inference_mode():
        got = model.hidden_states(ids, positions, meta, runner.kv).clone()
        kv_kernel = runner.kv.kv.clone()
        assert meta.decode_kernel is not None
        assert "decode" not in vars(meta)  # the torch path's decode groups never built
        assert fused.steps == 0  # not a decode-only step: the fused step did not run
        runner.kv.kv.copy_(kv_before)
        meta.decode_kernel = None
        model.fused_decode = None
        want = model.hidden_states(ids, positions, meta, runner.kv)
    assert "decode" in vars(meta)  # the reference took the gather + SDPA path
    torch.testing.assert_close(got, want, rtol=5e-5, atol=5e-5)
    torch.testing.assert_close(kv_kernel, runner.kv.kv, rtol=5e-5, atol=5e-5)


def test_a_float32_cache_is_required(gguf_dir):
    runner = TorchRunner(gguf_dir, block_size=BS, num_gpu_blocks=160, quantization="q4_1")
    meta, _, _ = mixed_step(runner, [5, 9], 3, 0)
    fused = runner.model.fused_decode
    assert fused.attends(meta, runner.kv)
    runner.kv.kv = runner.kv.kv.to(torch.bfloat16)
    assert not fused.attends(meta, runner.kv)
    prefill_only, _, _ = mixed_step(runner, [], 3, 0)
    assert not fused.attends(prefill_only, runner.kv)
