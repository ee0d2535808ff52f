"""RMSNorm's float32 fast path against the reference formula."""

from __future__ import annotations

import torch

from stepserve.model.llama import RMSNorm


def test_float32_rmsnorm_is_bit_for_bit_the_reference_formula():
    """llama.RMSNorm uses torch's fused rms_norm in float32: the same bits as the
    reference's x * rsqrt(mean(x^2) + eps) * weight."""
    g = torch.Generator().manual_seed(0)
    for rows, h, scale in [(1, 576, 1.0), (37, 576, 300.0), (5, 64, 1e-3), (3, 4096, 7.0)]:
        norm = RMSNorm(h, 1e-5)
        norm.weight.data = torch.randn(h, generator=g)
        x = torch.randn(rows, h, generator=g) * scale
        want = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
        assert torch.equal(norm(x), want)
