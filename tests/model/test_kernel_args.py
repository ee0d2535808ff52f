"""Tensors are checked before their pointers cross to the kernels (ggml_kernels.py): a wrong
dtype, a non-contiguous view, another device, a wrong shape or size, a format the build
cannot run, or a row index out of range is a clear KernelArgumentError naming the
argument, never garbage read from raw memory or a crashed process."""

from __future__ import annotations

import pytest
import torch

from stepserve.model.ggml_kernels import (
    FMT_F32,
    FMT_Q4_1,
    FMT_Q8_0,
    KernelArgumentError,
    kernels_unavailable_reason,
    load_kernels,
)
from stepserve.model.llama import rope_cos_sin
from stepserve.model.paged_attention import build_attention_metadata
from stepserve.model.runner import TorchRunner

pytestmark = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                reason=str(kernels_unavailable_reason()))
N, K = 40, 64


@pytest.fixture
def q4():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g),
            (torch.rand(N, K // 32, 2, generator=g) * 0.1).half())


@pytest.mark.parametrize("x,got", [
    (torch.randn(3, K, dtype=torch.float64), "got a float64 tensor of shape [3, 64] on cpu"),
    (torch.randn(K, 3).t(), "got a non-contiguous float32 tensor of shape [3, 64]"),
    (torch.empty(3, K, device="meta"), "on meta"),
    (torch.randn(3 * K), "got a float32 tensor of shape [192]"),
    ([[0.0] * K] * 3, "got a list"),
], ids=["float64", "non-contiguous", "meta-device", "one-dimensional", "not-a-tensor"])
def test_a_wrong_activation_tensor_is_named(q4, x, got):
    with pytest.raises(KernelArgumentError, match=r"ggml_matmul's x must be a contiguous "
                                                  r"float32 CPU tensor of 2 dimensions") as e:
        load_kernels().matmul(FMT_Q4_1, x, *q4, torch.empty(3, N))
    assert got in str(e.value)


def test_wrong_weights_and_outputs_are_named(q4):
    kernels, x = load_kernels(), torch.randn(3, K)
    qs, scales = q4
    cases = [
        (lambda: kernels.matmul(FMT_Q4_1, x, qs, scales, torch.empty(3, N + 1)),
         r"out must be .* of shape \[3, 40\]; got a float32 tensor of shape \[3, 41\]"),
        (lambda: kernels.matmul(FMT_Q4_1, x, qs.view(torch.int8), scales, torch.empty(3, N)),
         r"quants must be a contiguous uint8 CPU tensor"),
        (lambda: kernels.matmul(FMT_Q8_0, x, qs, scales, torch.empty(3, N)),
         r"quants must be a contiguous int8 CPU tensor"),
        (lambda: kernels.matmul(FMT_Q4_1, x, qs, scales.float(), torch.empty(3, N)),
         r"scales must be a contiguous float16 CPU tensor of 160 elements"),
        (lambda: kernels.matmul(FMT_Q4_1, x, qs, scales[:, :1], torch.empty(3, N)),
         r"scales must be .*; got a non-contiguous float16"),
        (lambda: kernels.matmul(7, x, qs, scales, torch.empty(3, N)),
         r"weight format 7 is not one of \[0, 1\]"),
        (lambda: kernels.matmul(FMT_Q4_1, torch.randn(3, 48), qs, scales, torch.empty(3, N)),
         r"K = 48 must be a positive multiple of 32"),
        (lambda: kernels.dequantize(FMT_Q4_1, qs, scales, K, torch.empty(2, K),
                                    rows=torch.tensor([0, N])),
         r"a row index is out of range \[0, 40\)"),
        (lambda: kernels.dequantize(FMT_Q4_1, qs, scales, K, torch.empty(2, K),
                                    rows=torch.tensor([0, 1], dtype=torch.int32)),
         r"rows must be a contiguous int64 CPU tensor of shape \[2\]"),
        (lambda: kernels.dequantize(FMT_Q4_1, qs, scales, K, torch.empty(N + 1, K)),
         r"41 rows asked of a 40-row matrix"),
    ]
    for call, message in cases:
        with pytest.raises(KernelArgumentError, match=message):
            call()


@pytest.mark.parametrize("fmt", [FMT_F32, 3])  # F32: decode_layers' only; 3: no format
def test_a_format_the_products_do_not_run_is_refused(q4, fmt):
    kernels = load_kernels(isa="avx2")
    with pytest.raises(KernelArgumentError, match=f"weight format {fmt} is not one of"):
        kernels.matmul(fmt, torch.randn(3, K), *q4, torch.empty(3, N))


def test_the_fused_step_checks_its_tensors(gguf_dir):
    runner = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=16, quantization="q4_1")
    fused, hidden = runner.model.fused_decode, runner.model.args.hidden_size
    meta, positions = build_attention_metadata([2, 4], [1, 1], [[0], [1, 2]], 4,
                                               torch.device("cpu"), num_decode=2)
    cos, sin = rope_cos_sin(runner.model.inv_freq, positions, torch.float32)
    x = torch.randn(hidden, 2).t()
    with pytest.raises(KernelArgumentError, match=r"decode_layers' x must be .* of shape "
                                                  rf"\[2, {hidden}\]; got a non-contiguous"):
        fused.run(x, cos, sin, meta, runner.kv)
    meta.decode_lens = meta.decode_lens.int()
    with pytest.raises(KernelArgumentError, match=r"decode_lens must be a contiguous int64"):
        fused.run(x.contiguous(), cos, sin, meta, runner.kv)
    assert fused.steps == 0
