"""Paged attention against plain dense causal attention, on random data scattered over
randomly ordered blocks: decode-only, prefill-only, chunked prefill, mixed, windowed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stepserve.model.paged_attention import (
    GatherBuffers,
    build_attention_metadata,
    decode_buckets,
    decode_first_order,
    paged_attention,
)

H, KVH, D = 4, 2, 8


def dense_reference(q_all, k_all, v_all, start, n, window=None):
    """Causal attention of the sequence's queries [start, start+n) over keys [0, start+n)."""
    ctx = start + n
    q = q_all[start:ctx].transpose(0, 1)  # [H, n, D]
    k = k_all[:ctx].repeat_interleave(H // KVH, dim=1).transpose(0, 1)
    v = v_all[:ctx].repeat_interleave(H // KVH, dim=1).transpose(0, 1)
    qpos = torch.arange(start, ctx)[:, None]
    kpos = torch.arange(ctx)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)


def run_case(seqs, block_size, window=None, seed=0, buffers=None):
    """seqs: (total_len, start, n) per sequence. Earlier positions [0, start) are written
    to the cache first (as earlier steps would), then one batched step computes the rest."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-t // block_size) for t, _, _ in seqs) + 3
    k_cache = torch.zeros(num_blocks, block_size, KVH, D)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, data = [], []
    for total, _, _ in seqs:
        nb = -(-total // block_size)
        tables.append([perm.pop() for _ in range(nb)])
        data.append(tuple(torch.randn(total, h, D, generator=g) for h in (H, KVH, KVH)))
    # earlier steps: write the KV of positions [0, start)
    for (_, start, _), table, (_, k, v) in zip(seqs, tables, data, strict=True):
        for p in range(start):
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
    # decoding: one new token after context (a one-token chunk at the start of a prompt
    # is a prefill, and takes the prefill path)
    decoding = [n == 1 and start > 0 for _, start, n in seqs]
    order = decode_first_order(decoding, [s + n for _, s, n in seqs])
    starts = [seqs[i][1] for i in order]
    lens = [seqs[i][2] for i in order]
    meta, positions = build_attention_metadata(starts, lens, [tables[i] for i in order],
                                               block_size, torch.device("cpu"), window,
                                               buffers, sum(decoding))
    q = torch.cat([data[i][0][seqs[i][1]:seqs[i][1] + seqs[i][2]] for i in order])
    k = torch.cat([data[i][1][seqs[i][1]:seqs[i][1] + seqs[i][2]] for i in order])
    v = torch.cat([data[i][2][seqs[i][1]:seqs[i][1] + seqs[i][2]] for i in order])
    out = paged_attention(q, k, v, k_cache, v_cache, meta, D ** -0.5)
    want = torch.cat([dense_reference(*data[i], seqs[i][1], seqs[i][2], window) for i in order])
    assert positions.tolist() == [p for i in order
                                  for p in range(seqs[i][1], seqs[i][1] + seqs[i][2])]
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_only(block_size):
    run_case([(5, 4, 1), (33, 32, 1), (1, 0, 1), (17, 16, 1)], block_size)


@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_only_fresh_prompts(block_size):
    run_case([(5, 0, 5), (40, 0, 40), (2, 0, 2)], block_size)


@pytest.mark.parametrize("buffers", [None, GatherBuffers()])
def test_chunked_prefill_mixed_with_decodes(buffers):
    # a middle chunk, a final chunk, decodes, a fresh prompt, interleaved in input order
    seqs = [(50, 21, 7), (9, 8, 1), (30, 0, 7), (64, 63, 1), (12, 5, 7), (3, 0, 3)]
    run_case(seqs, 4, buffers=buffers)
    run_case(seqs[:3], 4, seed=1, buffers=buffers)  # buffers reused at another size


def test_sliding_window():
    run_case([(40, 39, 1), (40, 20, 20), (10, 0, 10)], 4, window=6)


def test_skewed_decode_contexts_split_into_buckets():
    # 6 short chats and 2 long reports: two buckets, each padded to its own longest
    seqs = [(20 + i, 19 + i, 1) for i in range(6)] + [(700, 699, 1), (650, 649, 1)]
    ends = sorted(t for t, _, _ in seqs)
    assert decode_buckets(ends, 16) == [(0, 6), (6, 8)]
    run_case(seqs, 16)
    run_case(seqs, 16, buffers=GatherBuffers())


def test_decode_buckets_merge_small_differences():
    assert decode_buckets([5, 17, 40, 64], 16) == [(0, 4)]
    assert decode_buckets([], 16) == []
    assert decode_buckets([16] * 100 + [40], 16) == [(0, 100), (100, 101)]


def test_decode_first_order_sorts_decodes_by_context():
    decoding = [False, True, False, True, True]
    assert decode_first_order(decoding) == [1, 3, 4, 0, 2]
    assert decode_first_order(decoding, [9, 30, 5, 10, 20]) == [3, 4, 1, 0, 2]


def test_metadata_rejects_short_block_table():
    with pytest.raises(ValueError, match="cannot hold"):
        build_attention_metadata([0], [9], [[0, 1]], 4, torch.device("cpu"))


def test_metadata_rejects_wrong_order():
    with pytest.raises(ValueError, match="decodes of one token"):
        build_attention_metadata([0, 3], [4, 1], [[0], [1]], 4, torch.device("cpu"),
                                 num_decode=1)


def test_one_token_prefill_chunks_take_the_prefill_path():
    # a one-token prompt, and a one-token chunk in the middle of a prompt, beside a decode
    run_case([(1, 0, 1), (30, 12, 1), (9, 8, 1), (20, 0, 6)], 4)
