"""How many KV blocks a simulated replica has: one rule for scenarios and commands."""

from __future__ import annotations

from stepserve.config import EngineConfig
from stepserve.core.kv_cache import blocks_for


def num_gpu_blocks_for(config: EngineConfig, kv_cache_bytes: int | None = None,
                       kv_bytes_per_token: int | None = None) -> int:
    """KV blocks per replica: the config's num_gpu_blocks if set; else from a KV size
    (`kv_cache_bytes` / (`kv_bytes_per_token` x block_size), both given and non-zero);
    else enough for max_num_seqs sequences of max_model_len."""
    bs = config.cache.block_size
    if config.cache.num_gpu_blocks:
        return config.cache.num_gpu_blocks
    if kv_cache_bytes and kv_bytes_per_token:
        return kv_cache_bytes // (kv_bytes_per_token * bs)
    sc = config.scheduler
    return blocks_for(sc.max_model_len, bs) * sc.max_num_seqs + 1
