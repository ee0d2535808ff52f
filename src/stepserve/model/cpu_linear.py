"""oneDNN-prepacked linear layers for CPU inference.

`F.linear` on CPU re-lays-out the weight for its GEMM kernel on every call; prepacking it
once (the same ops torch.compile's CPU freezing uses) removes that work. Measured on
2 cores (Sapphire Rapids, fp32, SmolLM2 shapes, microseconds per call, packed/plain):

    gate_up 576->3072   M=1 158/123  M=8 209/367  M=64 772/978
    lm_head 576->49152  M=1 2241/2010  M=8 3164/6676  M=64 14109/17893

So packing wins from a few rows up and loses ~25% on single-row GEMV. Results differ
from `F.linear` in the last bits (a different summation order), like any other GEMM.

The ops are internal to torch (`torch.ops.mkldnn`); `packing_available()` checks they
exist and work, and the model falls back to plain `nn.Linear` where they do not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def packing_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.randn(8, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        x = torch.randn(3, 4)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return torch.allclose(y, F.linear(x, w), atol=1e-4)
    except (RuntimeError, AttributeError):
        return False


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's blocked layout (CPU only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias,
                                                  "none", [], "")


def pack_linears(module: nn.Module) -> int:
    """Replace every `nn.Linear` below `module` by a `PackedLinear`; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child.weight, child.bias))
            count += 1
        else:
            count += pack_linears(child)
    return count
