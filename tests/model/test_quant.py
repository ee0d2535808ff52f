"""The GGUF-quantised weights (quant.py) and their kernels (ggml_kernels.c), against
gguf-py's own quantisation and dequantisation.

Exactness contract: every weight the kernels use is bit-for-bit the float32 gguf-py (and
so the float reference) dequantises, and a product is float32 math on those weights: each
output is within 4 float32 roundings (4 * 2^-24) of the exact product, relative to
sum_k |x_k * w_k|. (float32 GEMMs in general, torch's included, land in that band; only
their summation order differs.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stepserve.model.ggml_kernels import (
    FMT_Q4_1,
    FMT_Q8_0,
    available_isas,
    kernels_unavailable_reason,
)
from stepserve.model.quant import (
    Q4_1,
    Q8_0,
    DequantScratch,
    GGUFEmbedding,
    GGUFLinear,
    GGUFMatrix,
)

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                   reason=str(kernels_unavailable_reason()))
ROUNDINGS = 4 * 2.0 ** -24
# N not a multiple of the kernel's 16-row task; 96: an odd number of groups
SHAPES = [(200, 576), (37, 1536), (49, 64), (23, 96)]


def gguf_blocks(fmt: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random weights quantised by gguf-py: uint8 [n, k/32 * block bytes]."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, :32] = 0.0  # a constant group: d = 0
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[fmt])


def gguf_dequantized(fmt: str, blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(gguf.quants.dequantize(
        blocks, gguf.GGMLQuantizationType[fmt]), dtype=np.float32))


def matrix(fmt: str, n: int, k: int, seed: int = 0) -> tuple[GGUFMatrix, torch.Tensor]:
    blocks = gguf_blocks(fmt, n, k, seed)
    return GGUFMatrix.from_blocks(fmt, torch.from_numpy(blocks)), gguf_dequantized(fmt, blocks)


def assert_float32_product(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    err = ((y.double() - exact).abs() / scale.clamp(min=1e-300)).max().item()
    assert err <= ROUNDINGS, f"error {err:.3g} x sum|xw| > {ROUNDINGS:.3g}"


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
@pytest.mark.parametrize("n,k", SHAPES)
def test_blocks_dequantize_like_gguf(fmt, n, k):
    blocks = gguf_blocks(fmt, n, k)
    m = GGUFMatrix.from_blocks(fmt, torch.from_numpy(blocks))
    assert m.shape == (n, k)
    assert torch.equal(m.dequantize(), gguf_dequantized(fmt, blocks))


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
def test_row_selection_and_fusion_move_whole_rows(fmt):
    _, wa = matrix(fmt, 48, 64, seed=1)
    b, wb = matrix(fmt, 16, 64, seed=2)
    index = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    # a row order on the file's bytes (how Q/K rows are un-permuted) moves whole rows
    rows = GGUFMatrix.from_blocks(fmt, torch.from_numpy(gguf_blocks(fmt, 48, 64, 1)[index]))
    fused = GGUFMatrix.cat([rows, b])
    assert torch.equal(fused.dequantize(), torch.cat([wa[index], wb]))


ISAS = available_isas() or ["avx2"]  # each build this CPU runs (AVX2, AVX-512)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_dequantizes_bit_for_bit(fmt, n, k, isa):
    from stepserve.model.ggml_kernels import load_kernels

    m, want = matrix(fmt, n, k)
    kernels = load_kernels(isa=isa)
    fmt_id = FMT_Q4_1 if fmt == Q4_1 else FMT_Q8_0
    assert torch.equal(kernels.dequantize(fmt_id, m.qs, m.scales, k, torch.empty(n, k)), want)
    rows = torch.tensor([n - 1, 0, 3, 3])
    got = kernels.dequantize(fmt_id, m.qs, m.scales, k, torch.empty(4, k), rows=rows)
    assert torch.equal(got, want[rows])


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 13, 40])
def test_linear_is_float32_math_on_the_dequantized_weights(fmt, n, k, rows, isa):
    """Both paths: the kernel (few rows) and dequantise + BLAS GEMM (from gemm_rows up)."""
    from stepserve.model.ggml_kernels import load_kernels

    m, w = matrix(fmt, n, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    kernel = GGUFLinear(m, load_kernels(isa=isa), DequantScratch(), gemm_rows=1 << 30)
    gemm = GGUFLinear(m, load_kernels(isa=isa), DequantScratch(), gemm_rows=1)
    assert_float32_product(kernel(x), x, w)
    assert torch.equal(gemm(x), F.linear(x, w))  # the same GEMM on the same weights
    assert kernel(x.view(1, rows, k)).shape == (1, rows, n)


@needs_kernels
def test_embedding_rows_are_the_dequantized_table():
    from stepserve.model.ggml_kernels import load_kernels

    m, w = matrix(Q8_0, 100, 64)
    emb = GGUFEmbedding(m, load_kernels())
    ids = torch.tensor([[5, 99], [0, 5]])
    assert torch.equal(emb(ids), F.embedding(ids, w))
    with pytest.raises(IndexError):
        emb(torch.tensor([100]))


@needs_kernels
def test_linear_refuses_bfloat16_activations():
    from stepserve.model.ggml_kernels import load_kernels

    m, _ = matrix(Q4_1, 16, 64)
    with pytest.raises(TypeError, match="float32"):
        GGUFLinear(m, load_kernels(), DequantScratch(), 16)(torch.randn(1, 64).bfloat16())


@needs_kernels
def test_gemm_path_dequantizes_a_slice_of_rows_at_a_time(monkeypatch):
    """The 49k-row head must not need a 113 MB scratch: slices of rows, tail included."""
    from stepserve.model import quant
    from stepserve.model.ggml_kernels import load_kernels

    monkeypatch.setattr(quant, "GEMM_SCRATCH_BYTES", 4 * 64 * 10)  # 10 rows of K = 64
    m, w = matrix(Q8_0, 37, 64)
    scratch = DequantScratch()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    y = GGUFLinear(m, load_kernels(), scratch, gemm_rows=1)(x)
    torch.testing.assert_close(y, F.linear(x, w), rtol=0, atol=1e-6)
    assert scratch.get(1, 1).untyped_storage().nbytes() <= 4 * 64 * 10

