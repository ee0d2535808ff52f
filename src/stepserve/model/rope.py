"""Rotary position embeddings with the checkpoint's frequency scaling.

The formulas mirror Hugging Face transformers (`_compute_default_rope_parameters`,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`) operation for
operation, because greedy decoding is compared against it token for token and a
different rounding of inv_freq would show up at long positions.
"""

from __future__ import annotations

import math

import torch

from stepserve.model.model_args import ModelArgs


def inv_frequencies(args: ModelArgs) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, scaled as the checkpoint asks."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (
        torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise ValueError(f"rope scaling type {kind!r} is not supported")


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend
    in between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [T, head_dim], for arbitrary (ragged) positions. Computed per step
    rather than cached for all positions: T x head_dim is tiny next to a layer, and it
    keeps 128k-context checkpoints from holding a huge table."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] in the Hugging Face half-split layout (GGUF's interleaved
    layout was undone at conversion)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
