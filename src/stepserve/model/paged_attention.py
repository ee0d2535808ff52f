"""Attention over a paged KV cache for a ragged batch.

A step's batch is flattened: sequence b contributes `n_b` query tokens at positions
`start_b .. start_b + n_b - 1` and attends to its keys at positions `0 .. start_b + n_b - 1`
(causally). Prefill, chunked prefill and decode are the same rule; only n_b differs.

The batch is laid out decode sequences first (n_b == 1), then the others, and each group
runs as one batched tensor operation:

* decode: gather every sequence's blocks into a padded `[B, ctx, kv_heads, head_dim]`
  tensor with one index op on the block tables, then one SDPA call with a padding mask.
* prefill (n_b > 1, any start): pad queries to `[B, max_q]`, gather contexts the same
  way, one SDPA call with a causal + padding mask, then unpad.

Splitting the groups keeps a long prompt chunk from padding every decode query to its
length. New K/V are written into the cache first (one index_copy per tensor via the slot
mapping), so a query sees its own token and the rest of its chunk through the cache.

Measured on 2 CPU cores (SmolLM2 shapes, batch 64, context 64): SDPA on the gathered,
transposed views took 0.9 ms per layer against 2.6 ms for explicit matmul + softmax and
2.1 ms for SDPA on contiguous copies; the gather itself is half of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    block_tables: torch.Tensor  # [B, max_blocks] int64; pads point at block 0 (masked)
    mask: torch.Tensor  # [B, 1, 1, max_blocks * block_size] bool, True: attend


@dataclass
class PrefillGroup:
    block_tables: torch.Tensor  # [B, max_blocks]
    pad_index: torch.Tensor  # [T_prefill] row of each query token in the flat [B * max_q]
    max_q: int
    mask: torch.Tensor  # [B, 1, max_q, max_blocks * block_size] bool


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step; built once, shared by every layer."""

    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of each token
    num_decode_tokens: int  # the first rows are decode tokens, one per sequence
    decode: DecodeGroup | None
    prefill: PrefillGroup | None


def _pad_tables(tables: list[list[int]], width: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([t[:width] + [0] * (width - len(t[:width])) for t in tables],
                        dtype=torch.long, device=device)


def _window_mask(kpos: torch.Tensor, qpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal mask (keys at or before the query), optionally a sliding window."""
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    return mask


def build_attention_metadata(starts: list[int], num_tokens: list[int],
                             block_tables: list[list[int]], block_size: int,
                             device: torch.device, sliding_window: int | None = None,
                             ) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata and positions `[T]` for sequences given decode-first (all n == 1 before
    any n > 1; see `decode_first_order`). `block_tables[b]` must cover start + n tokens."""
    num_seqs = len(starts)
    num_decode = 0
    while num_decode < num_seqs and num_tokens[num_decode] == 1:
        num_decode += 1
    if any(n == 1 for n in num_tokens[num_decode:]):
        raise ValueError("sequences must be ordered decode-first (n == 1 before n > 1)")
    ends = [s + n for s, n in zip(starts, num_tokens, strict=True)]
    for b, (end, table) in enumerate(zip(ends, block_tables, strict=True)):
        if len(table) * block_size < end:
            raise ValueError(f"sequence {b}: {len(table)} blocks cannot hold {end} tokens")

    # Positions and slots of the new tokens, without a per-token Python loop.
    lens = torch.tensor(num_tokens, dtype=torch.long)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), lens)
    first_token = torch.cumsum(lens, 0) - lens
    offset = torch.arange(int(lens.sum())) - first_token[seq_of_token]
    positions = torch.tensor(starts, dtype=torch.long)[seq_of_token] + offset
    width = -(-max(ends) // block_size)
    tables = _pad_tables(block_tables, width, torch.device("cpu"))
    slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size

    decode = prefill = None
    if num_decode:
        ctx = torch.tensor(ends[:num_decode])
        w = -(-max(ends[:num_decode]) // block_size)
        kpos = torch.arange(w * block_size)
        mask = _window_mask(kpos[None, :], (ctx - 1)[:, None], sliding_window)
        decode = DecodeGroup(tables[:num_decode, :w].to(device), mask[:, None, None, :].to(device))
    if num_decode < num_seqs:
        p_starts = torch.tensor(starts[num_decode:])
        p_lens = lens[num_decode:]
        max_q = int(p_lens.max())
        w = -(-max(ends[num_decode:]) // block_size)
        local_seq = seq_of_token[num_decode:] - num_decode
        pad_index = local_seq * max_q + offset[num_decode:]
        qpos = p_starts[:, None] + torch.arange(max_q)[None, :]  # [B, max_q]
        kpos = torch.arange(w * block_size)
        mask = _window_mask(kpos[None, None, :], qpos[:, :, None], sliding_window)
        prefill = PrefillGroup(tables[num_decode:, :w].to(device), pad_index.to(device), max_q,
                               mask[:, None].to(device))
    meta = AttentionMetadata(slots.to(device), num_decode, decode, prefill)
    return meta, positions.to(device)


def decode_first_order(num_tokens: list[int]) -> list[int]:
    """Indices of the scheduled sequences, decodes (n == 1) first, order kept within each."""
    return ([i for i, n in enumerate(num_tokens) if n == 1]
            + [i for i, n in enumerate(num_tokens) if n != 1])


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks * block_size, kv_heads, head_dim] view of each sequence's context,
    in position order (block i of the table holds positions i*bs .. i*bs + bs - 1)."""
    b, w = tables.shape
    return cache[tables].view(b, w * cache.shape[1], cache.shape[2], cache.shape[3])


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] of the new tokens.
    Writes k, v into the caches, returns attention output [T, heads, head_dim]."""
    kvh, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, v)
    outs = []
    nd = meta.num_decode_tokens
    if meta.decode is not None:
        g = meta.decode
        kc = _gather(k_cache, g.block_tables).transpose(1, 2)
        vc = _gather(v_cache, g.block_tables).transpose(1, 2)
        out = F.scaled_dot_product_attention(q[:nd].unsqueeze(2), kc, vc, attn_mask=g.mask,
                                             scale=scale, enable_gqa=True)
        outs.append(out.squeeze(2))
    if meta.prefill is not None:
        g = meta.prefill
        b = g.block_tables.shape[0]
        qp = q.new_zeros(b * g.max_q, q.shape[1], q.shape[2])
        qp.index_copy_(0, g.pad_index, q[nd:])
        qp = qp.view(b, g.max_q, q.shape[1], q.shape[2]).transpose(1, 2)
        kc = _gather(k_cache, g.block_tables).transpose(1, 2)
        vc = _gather(v_cache, g.block_tables).transpose(1, 2)
        out = F.scaled_dot_product_attention(qp, kc, vc, attn_mask=g.mask, scale=scale,
                                             enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * g.max_q, q.shape[1], q.shape[2])
        outs.append(out.index_select(0, g.pad_index))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
