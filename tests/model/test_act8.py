"""The int8-activation kernels (ggml_act8.c, the `q4_1_q8` mode) against the arithmetic
they document: each activation group of 32 rounded to int8 like llama.cpp's Q8_1
(d = max|x| / 127, q = round-half-even(x / d), s = d * sum(q)), then per group
(d_w d_x) (q_w . q_x) + m_w s_x, exact integers summed in float. And that the mode is
refused where it cannot run, and loads where it can."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stepserve.model.ggml_kernels import (
    FMT_Q4_1,
    FMT_Q4_1_Q8,
    available_isas,
    kernels_unavailable_reason,
    load_kernels,
)
from stepserve.model.modes import choose_quantization
from stepserve.model.quant import Q4_1, DequantScratch, GGUFLinear, GGUFMatrix

pytestmark = pytest.mark.skipif(
    kernels_unavailable_reason() is not None or "avx512_vnni" not in available_isas(),
    reason="needs the AVX-512 VNNI kernel build (this CPU lacks avx512_vnni)")
# K: 2 groups (one partial block of 4), 3, 18 (4 full blocks + 2: the default model's
# hidden size), 48 (no partial block); N not a multiple of the 4-row pass or 16-row task.
SHAPES = [(37, 64), (23, 96), (200, 576), (41, 1536)]


def random_q4_1(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    qs = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.stack([torch.rand(n, k // 32, generator=g) * 0.02,
                          (torch.rand(n, k // 32, generator=g) - 0.5) * 0.2], -1).half()
    return qs, scales


def reference(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The documented arithmetic: quantisation in float32, the sums in float64."""
    n, groups = qs.shape[0], qs.shape[1] // 16
    q_w = torch.cat([(qs & 0xF).view(n, groups, 16), (qs >> 4).view(n, groups, 16)], -1)
    xg = x.view(x.shape[0], groups, 32)
    d_x = xg.abs().amax(-1) / 127.0
    inv = torch.where(d_x > 0, 1.0 / d_x, torch.zeros_like(d_x))
    q_x = torch.round(xg * inv[..., None])  # half to even, as the kernel's cvtps2dq
    assert q_x.abs().max() <= 127
    s_x = d_x * q_x.sum(-1)
    dots = torch.einsum("ngk,mgk->mng", q_w.double(), q_x.double())
    d_w, m_w = scales[..., 0].double(), scales[..., 1].double()
    return (dots * d_w * d_x.double()[:, None] + m_w * s_x.double()[:, None]).sum(-1)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 17])
def test_kernel_computes_the_documented_int8_arithmetic(n, k, rows):
    kernels = load_kernels(isa="avx512_vnni")
    assert kernels.has_act8
    qs, scales = random_q4_1(n, k, seed=n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0.0  # an all-zero group: d_x = 0
    got = kernels.matmul(FMT_Q4_1_Q8, x, qs, scales, torch.empty(rows, n)).double()
    want = reference(x, qs, scales)
    # float32 sums of exact integer dots: within a few roundings of the float64 result
    bound = 1e-5 * want.abs().amax(-1, keepdim=True).clamp(min=1.0)
    assert ((got - want).abs() <= bound).all(), (got - want).abs().max()
    # and it really rounds the activations: the float32 product is further off than that
    exact = kernels.matmul(FMT_Q4_1, x, qs, scales, torch.empty(rows, n)).double()
    assert ((exact - want).abs() > bound).any()


def test_only_q4_1_matrices_take_int8_activations_and_never_the_float_gemm():
    kernels = load_kernels(isa="avx512_vnni")
    qs, scales = random_q4_1(40, 64, seed=0)
    lin = GGUFLinear(GGUFMatrix(Q4_1, qs, scales), None, kernels, DequantScratch(),
                     gemm_rows=1, int8_activations=True)
    assert lin.kernel_format == FMT_Q4_1_Q8 and lin.gemm_rows > 1 << 40
    x = torch.randn(300, 64)  # a prefill chunk: still the int8 kernel
    torch.testing.assert_close(lin(x).double(), reference(x, qs, scales), rtol=0, atol=1e-4)


def test_a_build_without_vnni_refuses_the_mode(monkeypatch):
    avx512 = load_kernels(isa="avx512")
    assert not avx512.has_act8
    qs, scales = random_q4_1(40, 64, seed=0)
    with pytest.raises(ValueError, match="VNNI"):
        GGUFLinear(GGUFMatrix(Q4_1, qs, scales), None, avx512, DequantScratch(), 64,
                   int8_activations=True)
    monkeypatch.setenv("STEPSERVE_KERNEL_ISA", "avx512")
    with pytest.raises(ValueError, match="q4_1_q8.*VNNI"):
        choose_quantization("q4_1_q8", "float32", torch.device("cpu"), gguf=Path(__file__))


def test_the_mode_is_float32_only_and_never_auto():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="float32"):
        choose_quantization("q4_1_q8", "bfloat16", cpu, gguf=Path(__file__))
    assert choose_quantization("q4_1_q8", "float32", cpu, gguf=Path(__file__)) == ("q4_1_q8", None)
    assert choose_quantization("auto", "float32", cpu, gguf=Path(__file__)) == ("q4_1", None)
