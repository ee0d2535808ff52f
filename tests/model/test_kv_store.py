"""KV store sizing and block copies."""

from __future__ import annotations

import torch

from stepserve.model.kv_store import KVBudget, KVStore, default_kv_budget, num_blocks_for_memory
from stepserve.model.model_args import ModelArgs

ARGS = ModelArgs(vocab_size=10, hidden_size=16, intermediate_size=32, num_layers=3,
                 num_heads=4, num_kv_heads=2, head_dim=4)


def test_blocks_for_memory():
    per_token = 2 * 3 * 2 * 4 * 4  # K and V, layers, kv heads, head dim, float32
    assert ARGS.kv_bytes_per_token == per_token
    assert num_blocks_for_memory(per_token * 16 * 10 + 5, ARGS, 16) == 10
    assert num_blocks_for_memory(per_token * 15, ARGS, 16) == 0


def test_default_budget_is_bounded_and_explained():
    budget = default_kv_budget("cpu")
    assert 0 < budget.num_bytes <= 4 << 30
    text = budget.describe(ARGS, 16)
    assert "GiB" in text and "blocks" in text and "MemAvailable" in text
    assert "configured" in KVBudget(1 << 20, "configured").describe(ARGS, 16)


def test_copy_blocks_round_trip():
    kv = KVStore(ARGS, num_blocks=6, block_size=2, num_cpu_blocks=4)
    kv.kv.normal_()
    original = kv.kv.clone()
    kv.copy_blocks_to_cpu([(1, 3), (4, 0)])
    assert torch.equal(kv.cpu_kv[:, :, 3], original[:, :, 1])
    kv.kv.zero_()
    kv.copy_blocks_from_cpu([(3, 5), (0, 2)])
    assert torch.equal(kv.kv[:, :, 5], original[:, :, 1])
    assert torch.equal(kv.kv[:, :, 2], original[:, :, 4])
    assert kv.layer(1)[0].shape == (6, 2, 2, 4) and kv.layer(1)[0].is_contiguous()
    kv.copy_blocks_to_cpu([])  # no-op
