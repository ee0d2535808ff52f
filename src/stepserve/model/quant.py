"""Quantised weights (`GGUFMatrix`: Q4_1 w = d * q + m, or Q8_0 w = d * q, in groups of 32
along K) and the layers that run on them through our kernels. From `gemm_rows` activation
rows up, `GGUFLinear` dequantises into a shared scratch and runs a BLAS GEMM instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stepserve.model.ggml_kernels import FMT_Q4_1, FMT_Q8_0, GROUP, GGMLKernels

Q4_1, Q8_0 = "Q4_1", "Q8_0"
_BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # a GGUF block: scales then quants
_SCALES_PER_GROUP = {Q4_1: 2, Q8_0: 1}
KERNEL_FORMAT = {Q4_1: FMT_Q4_1, Q8_0: FMT_Q8_0}
GEMM_SCRATCH_BYTES = 8 << 20  # the BLAS path dequantises at most this much at a time


@dataclass(frozen=True)
class GGUFMatrix:
    """A [N, K] weight in GGUF groups: `qs` (Q4_1: uint8 [N, K/2], byte j of a group holds
    elements j and j + 16 in its low and high nibble; Q8_0: int8 [N, K]) and `scales`
    (fp16 [N, K/32, 2] = (d, m) for Q4_1, [N, K/32] = d for Q8_0)."""

    fmt: str
    qs: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        n = self.qs.shape[0]
        return n, self.scales.shape[1] * GROUP

    @classmethod
    def from_blocks(cls, fmt: str, blocks: torch.Tensor) -> GGUFMatrix:
        """From the file's bytes: uint8 [N, K/32 * block bytes] (GGUF blocks in row order)."""
        if fmt not in _BLOCK_BYTES:
            raise ValueError(f"GGUF type {fmt}: only {Q4_1} and {Q8_0} run quantised")
        n = blocks.shape[0]
        blocks = blocks.reshape(n, -1, _BLOCK_BYTES[fmt])
        head = 2 * _SCALES_PER_GROUP[fmt]
        scales = blocks[..., :head].contiguous().view(torch.float16)
        qs = blocks[..., head:].reshape(n, -1).contiguous()
        if fmt == Q8_0:
            return cls(fmt, qs.view(torch.int8), scales.squeeze(-1).contiguous())
        return cls(fmt, qs, scales)

    @staticmethod
    def cat(parts: list[GGUFMatrix]) -> GGUFMatrix:
        """Row-wise concatenation (fused projections)."""
        fmt = parts[0].fmt
        if any(p.fmt != fmt for p in parts):
            raise ValueError(f"cannot fuse {[p.fmt for p in parts]}: formats differ")
        return GGUFMatrix(fmt, torch.cat([p.qs for p in parts]),
                          torch.cat([p.scales for p in parts]))

    def quants(self) -> torch.Tensor:
        """q as int32 [N, K] in element order (Q4_1: 0..15; Q8_0: -128..127)."""
        n, k = self.shape
        if self.fmt == Q8_0:
            return self.qs.to(torch.int32)
        groups = self.qs.view(n, k // GROUP, GROUP // 2)
        q = torch.cat([groups & 0xF, groups >> 4], dim=-1)
        return q.reshape(n, k).to(torch.int32)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K], computed as gguf-py does: (d * q) + m, d * q exact."""
        n, k = self.shape
        q = self.quants().float().view(n, k // GROUP, GROUP)
        s = self.scales.float()
        if self.fmt == Q8_0:
            return (s.unsqueeze(-1) * q).view(n, k)
        return (s[..., :1] * q + s[..., 1:]).view(n, k)


class DequantScratch:
    """The float32 buffer a model's `GGUFLinear`s dequantise into, one after another (a
    fresh tensor per call would page-fault megabytes every step)."""

    def __init__(self) -> None:
        self._buffer = torch.empty(0)

    def get(self, n: int, k: int) -> torch.Tensor:
        if self._buffer.numel() < n * k:
            self._buffer = torch.empty(n * k)
        return self._buffer[:n * k].view(n, k)


class GGUFModule(nn.Module):
    """A layer on a `GGUFMatrix`'s groups, its buffers `qs` and `scales`."""

    def __init__(self, weight: GGUFMatrix, kernels: GGMLKernels) -> None:
        super().__init__()
        self.fmt, self.kernel_format, self.kernels = weight.fmt, KERNEL_FORMAT[weight.fmt], kernels
        self.register_buffer("qs", weight.qs)
        self.register_buffer("scales", weight.scales)


class GGUFLinear(GGUFModule):
    """y = x @ W.T, W a `GGUFMatrix`, x float32 (the quantised loader refuses biases)."""

    def __init__(self, weight: GGUFMatrix, kernels: GGMLKernels, scratch: DequantScratch,
                 gemm_rows: int) -> None:
        super().__init__(weight, kernels)
        self.out_features, self.in_features = weight.shape
        self.scratch, self.gemm_rows = scratch, gemm_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Lean on purpose: ~120 calls a decode step, each a few tens of microseconds.
        if x.dtype != torch.float32:
            raise TypeError(f"GGUFLinear computes in float32, got {x.dtype} activations")
        lead = x.shape[:-1]
        x2 = (x if x.dim() == 2 else x.reshape(-1, self.in_features)).contiguous()
        if x2.shape[0] >= self.gemm_rows:
            y = self._dequantize_and_gemm(x2)
        else:
            y = self.kernels.matmul(self.kernel_format, x2, self.qs, self.scales,
                                    torch.empty(x2.shape[0], self.out_features))
        return y if x.dim() == 2 else y.view(*lead, self.out_features)

    def _dequantize_and_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The BLAS path, a slice of output features at a time so the scratch stays small
        (the 49k-row head would need 113 MB at once)."""
        n, k = self.out_features, self.in_features
        step = max(1, min(n, GEMM_SCRATCH_BYTES // (4 * k)))
        if step == n:
            w = self.scratch.get(n, k)
            self.kernels.dequantize(self.kernel_format, self.qs, self.scales, k, w)
            return F.linear(x, w)
        y = torch.empty(x.shape[0], n)
        for n0 in range(0, n, step):
            rows = min(step, n - n0)
            w = self.scratch.get(rows, k)
            self.kernels.dequantize(self.kernel_format, self.qs[n0:n0 + rows],
                                    self.scales[n0:n0 + rows], k, w)
            y[:, n0:n0 + rows] = F.linear(x, w)
        return y

    def extra_repr(self) -> str:
        return (f"{self.fmt}, in_features={self.in_features}, "
                f"out_features={self.out_features}, gemm_rows={self.gemm_rows}")


class GGUFEmbedding(GGUFModule):
    """Token embedding rows dequantised on lookup (the table stays in its GGUF groups)."""

    def __init__(self, weight: GGUFMatrix, kernels: GGMLKernels) -> None:
        super().__init__(weight, kernels)
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < self.num_embeddings:
            raise IndexError(f"token id out of range [0, {self.num_embeddings})")
        out = torch.empty(flat.numel(), self.embedding_dim)
        self.kernels.dequantize(self.kernel_format, self.qs, self.scales, self.embedding_dim,
                                out, rows=flat)
        return out.view(*ids.shape, self.embedding_dim)
