"""The Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over a ragged, flattened batch
with a paged KV cache. Only the rows that sample get an lm_head projection (vocab 49k
times a 512-token chunk would cost more than the layers); q/k/v and gate/up are fused.
Rotary embeddings follow transformers operation for operation: greedy output is compared
with it token for token.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from stepserve.model.kv_store import KVStore
from stepserve.model.model_args import ModelArgs
from stepserve.model.paged_attention import AttentionMetadata, paged_attention


def inv_frequencies(args: ModelArgs) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, scaled as the checkpoint asks."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (
        torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", "default")  # ModelArgs refused the others
    if kind == "linear":
        return inv_freq / scaling["factor"]
    return _llama3(inv_freq, scaling) if kind == "llama3" else inv_freq


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's fused kernel, bit-for-bit the formula below in float32: one op
            # instead of seven (~20 us instead of ~55 us a call, 61 calls a decode step).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 whatever the compute dtype, as the reference does.
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = args.num_heads, args.num_kv_heads
        self.head_dim = args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(args.hidden_size, sum(self.split), bias=args.attention_bias)
        self.o_proj = nn.Linear(q_size, args.hidden_size, bias=args.o_proj_bias)
        self.scale = args.head_dim ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = apply_rope(q.view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size,
                                      bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        proj = self.gate_up_proj
        if isinstance(proj, nn.Linear):
            # Two half-width GEMMs on views of the fused weight: MKL is slow on the fused
            # shape at a few rows (8 x 576 x 3072: 355 us against 2 x 125 us).
            half = proj.out_features // 2
            w, b = proj.weight, proj.bias
            gate = F.linear(x, w[:half], None if b is None else b[:half])
            up = F.linear(x, w[half:], None if b is None else b[half:])
        else:
            gate, up = proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Parameter names follow the Hugging Face checkpoint (`model.layers.N...`) except the
    fused `qkv_proj` and `gate_up_proj`."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = (None if args.tie_word_embeddings
                        else nn.Linear(args.hidden_size, args.vocab_size, bias=False))
        self.register_buffer("inv_freq", inv_frequencies(args), persistent=False)
        # replaces the tied embedding in `logits`: its quantised groups as a linear layer
        self.packed_head: nn.Module | None = None
        # fused_decode.FusedDecoder, set by the runner where the weights allow
        self.fused_decode = None

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      meta: AttentionMetadata, kv: KVStore) -> torch.Tensor:
        """Last-layer hidden states [T, hidden] (before the final norm) of every token."""
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        fused = self.fused_decode
        if fused is not None and fused.applies(meta, kv):
            return fused.run(x, cos, sin, meta, kv)
        if fused is not None and fused.attends(meta, kv):  # a mixed step's decode rows
            meta.decode_kernel = partial(fused.attend_decodes, meta=meta, kv=kv)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv.layer(i)
            x = layer(x, cos, sin, k_cache, v_cache, meta)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] in float32 (sampling wants full precision whatever the dtype)."""
        if self.packed_head is not None:
            return self.packed_head(hidden).float()
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv: KVStore,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for the rows in `logits_indices` (all rows when None)."""
        hidden = self.hidden_states(input_ids, positions, meta, kv)
        if logits_indices is not None:  # the norm is per row: select first, norm fewer rows
            hidden = hidden.index_select(0, logits_indices)
        return self.logits(self.norm(hidden))
