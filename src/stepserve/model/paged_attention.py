"""Attention over a paged KV cache for a ragged, flattened batch: sequence b brings n_b query
tokens at positions start_b.. and attends causally to its cached keys; new K/V are written
into the cache first (one index_copy via the slot mapping). Decode rows come first and run
in buckets of similar context (each padded only to its own longest), gathered with one
index op and one SDPA call; prefill chunks are padded to [B, max_q] and run as one SDPA
call. Where the GGUF kernels run on a float32 CPU cache, a mixed step's decode rows attend
in C instead (decode_attention.c: 597 to 475 ms for 31 decodes at 1,100 tokens + a 108-token
chunk on 2 AVX2 cores). SDPA on the gathered views: 0.9 ms a layer against 2.6 ms for
matmul + softmax.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    """Sequences attending in one SDPA call: queries padded to [B, max_q], keys to the
    group's longest context."""

    block_tables: torch.Tensor  # [B, max_blocks] int64; pads point at block 0 (masked)
    mask: torch.Tensor  # [B, 1, max_q, max_blocks * block_size] bool, True: attend
    max_q: int = 1
    # the row of each query token in the flat [B * max_q]; None: one query per sequence,
    # the step's next B rows
    pad_index: torch.Tensor | None = None


class GatherBuffers:
    """One K and one V buffer for the context gathers (they run one at a time), kept across
    layers and steps: glibc returns large frees to the OS, so a fresh 15 MB gather paid
    more in page faults than the copy (a 54 x 20 + 10 x 2000 decode step: ~450 ms)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def get(self, num_blocks: int, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k
        if (k is None or k.shape[0] < num_blocks or k.dtype != cache.dtype
                or k.device != cache.device):
            shape = (num_blocks + num_blocks // 4, *cache.shape[1:])  # headroom: fewer regrows
            self.k = torch.empty(shape, dtype=cache.dtype, device=cache.device)
            self.v = torch.empty_like(self.k)
        assert self.k is not None and self.v is not None
        return self.k[:num_blocks], self.v[:num_blocks]


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step; built once, shared by every layer."""

    slot_mapping: torch.Tensor  # [T] cache slot (block * block_size + offset) of each token
    num_decode_tokens: int  # the first rows are decode tokens, one per sequence
    decode_groups: Callable[[], list[AttentionGroup]]  # builds `decode`, on first use
    prefill: AttentionGroup | None
    buffers: GatherBuffers | None = None  # None: allocate per gather
    # for the decode kernels: the decode rows' block tables and context lengths (the new
    # token included)
    decode_tables: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None
    # set by the model for a mixed step the kernels attend: (q, k_cache, v_cache, scale)
    # -> [num_decode, heads, head_dim] instead of gather + SDPA
    decode_kernel: Callable[..., torch.Tensor] | None = None

    @cached_property
    def decode(self) -> list[AttentionGroup]:
        """Consecutive runs of the decode rows (buckets of similar context), built when
        the torch path first asks: a fused decode step never does (~0.2 ms at batch 1)."""
        return self.decode_groups()


def _window_mask(kpos: torch.Tensor, qpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal mask (keys at or before the query), optionally a sliding window."""
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    return mask


def build_attention_metadata(starts: list[int], num_tokens: list[int],
                             block_tables: list[list[int]], block_size: int,
                             device: torch.device, sliding_window: int | None = None,
                             buffers: GatherBuffers | None = None, num_decode: int = 0,
                             ) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata and positions `[T]` for sequences given decode-first: the first
    `num_decode` are decoding requests (`Request.is_decoding`: one new token each, see
    `decode_first_order`), the rest prefill chunks of any length. `block_tables[b]` must
    cover start + n tokens."""
    num_seqs = len(starts)
    if not 0 <= num_decode <= num_seqs or any(n != 1 for n in num_tokens[:num_decode]):
        raise ValueError(f"the first {num_decode} sequences must be decodes of one token")
    ends = [s + n for s, n in zip(starts, num_tokens, strict=True)]
    for b, (end, table) in enumerate(zip(ends, block_tables, strict=True)):
        if len(table) * block_size < end:
            raise ValueError(f"sequence {b}: {len(table)} blocks cannot hold {end} tokens")

    width = -(-max(ends) // block_size)
    tables = torch.tensor([t[:width] + [0] * (width - len(t[:width])) for t in block_tables],
                          dtype=torch.long)
    if num_decode == num_seqs:  # one token each, at its start: two lists, no tensor ops
        positions = torch.tensor(starts, dtype=torch.long)
        slots = torch.tensor([t[p // block_size] * block_size + p % block_size
                              for p, t in zip(starts, block_tables)], dtype=torch.long)
    else:  # positions and slots of the new tokens, without a per-token Python loop
        lens = torch.tensor(num_tokens, dtype=torch.long)
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), lens)
        first_token = torch.cumsum(lens, 0) - lens
        offset = torch.arange(int(lens.sum())) - first_token[seq_of_token]
        positions = torch.tensor(starts, dtype=torch.long)[seq_of_token] + offset
        slots = (tables[seq_of_token, positions // block_size] * block_size
                 + positions % block_size)

    def group(lo: int, hi: int, qpos: torch.Tensor,
              pad_index: torch.Tensor | None = None) -> AttentionGroup:
        """Sequences lo..hi-1, their query positions qpos [B, max_q]."""
        kpos = torch.arange(-(-max(ends[lo:hi]) // block_size) * block_size)
        mask = _window_mask(kpos[None, None, :], qpos[:, :, None], sliding_window)
        return AttentionGroup(tables[lo:hi, :len(kpos) // block_size].to(device),
                              mask[:, None].to(device), qpos.shape[1],
                              None if pad_index is None else pad_index.to(device))

    def decode_groups() -> list[AttentionGroup]:
        return [group(lo, hi, torch.tensor(ends[lo:hi])[:, None] - 1)
                for lo, hi in decode_buckets(ends[:num_decode], block_size)]

    prefill = None
    if num_decode < num_seqs:
        max_q = int(lens[num_decode:].max())
        qpos = torch.tensor(starts[num_decode:])[:, None] + torch.arange(max_q)[None, :]
        pad_index = (seq_of_token[num_decode:] - num_decode) * max_q + offset[num_decode:]
        prefill = group(num_decode, num_seqs, qpos, pad_index)
    meta = AttentionMetadata(slots.to(device), num_decode, decode_groups, prefill, buffers,
                             tables[:num_decode].contiguous().to(device),
                             torch.tensor(ends[:num_decode], dtype=torch.long, device=device))
    return meta, positions.to(device)


def decode_first_order(decoding: list[bool],
                       context_lens: list[int] | None = None) -> list[int]:
    """Indices of the scheduled sequences: decodes first (`decoding[i]`, from
    `Request.is_decoding`), sorted by context length when given (so `decode_buckets` can
    cut them into similar lengths), then the rest; ties keep their order."""
    decodes = [i for i, d in enumerate(decoding) if d]
    if context_lens is not None:
        decodes.sort(key=lambda i: context_lens[i])
    return decodes + [i for i, d in enumerate(decoding) if not d]


# A bucket costs a few fixed op launches per layer (~70 us on 2 CPU cores), about what
# gathering and attending ~300 padded tokens costs; merge while the padding a merge adds
# stays below this.
MERGE_WASTE_TOKENS = 512


def decode_buckets(ends: list[int], block_size: int) -> list[tuple[int, int]]:
    """Cut decode sequences (context lengths `ends`, ideally ascending) into consecutive
    [lo, hi) runs; each run is padded to its longest context."""
    buckets: list[list[int]] = []  # [lo, hi, padded width in tokens]
    for i, end in enumerate(ends):
        width = -(-end // block_size) * block_size
        if buckets:
            last = buckets[-1]
            if (last[1] - last[0]) * (width - last[2]) <= MERGE_WASTE_TOKENS:
                last[1], last[2] = i + 1, max(last[2], width)
                continue
        buckets.append([i, i + 1, width])
    return [(lo, hi) for lo, hi, _ in buckets]


def _gather(cache: torch.Tensor, tables: torch.Tensor,
            out: torch.Tensor | None) -> torch.Tensor:
    """[B, kv_heads, max_blocks * block_size, head_dim] (a transposed view) of each
    sequence's context in position order: block i of a table holds positions
    i*bs .. i*bs + bs - 1."""
    b, w = tables.shape
    # index_select on the flat table copies whole blocks; `cache[tables]` (advanced
    # indexing) is 3x slower for the same bytes on CPU (15 MB: 0.54 ms against 1.61 ms).
    blocks = torch.index_select(cache, 0, tables.reshape(-1), out=out)
    return blocks.view(b, w * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


def _gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
               buffers: GatherBuffers | None) -> tuple[torch.Tensor, torch.Tensor]:
    k_out = v_out = None
    if buffers is not None:
        k_out, v_out = buffers.get(tables.numel(), k_cache)
    return _gather(k_cache, tables, k_out), _gather(v_cache, tables, v_out)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] of the new tokens.
    Writes k, v into the caches, returns attention output [T, heads, head_dim]."""
    kvh, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, v)
    outs, row, nd, heads = [], 0, meta.num_decode_tokens, q.shape[1]
    if nd and meta.decode_kernel is not None:
        outs.append(meta.decode_kernel(q[:nd], k_cache, v_cache, scale))
        row = nd
    groups = [*(meta.decode if row == 0 else ()), *filter(None, [meta.prefill])]
    for g in groups:
        b = g.block_tables.shape[0]
        if g.pad_index is None:  # the next b decode rows
            qg, row = q[row:row + b], row + b
        else:
            qg = q.new_zeros(b * g.max_q, heads, hd).index_copy_(0, g.pad_index, q[nd:])
        kc, vc = _gather_kv(k_cache, v_cache, g.block_tables, meta.buffers)
        out = F.scaled_dot_product_attention(qg.view(b, g.max_q, heads, hd).transpose(1, 2),
                                             kc, vc, attn_mask=g.mask, scale=scale,
                                             enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * g.max_q, heads, hd)
        outs.append(out if g.pad_index is None else out.index_select(0, g.pad_index))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
