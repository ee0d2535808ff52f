"""How many KV blocks a simulated replica has: one rule for scenarios and commands."""

from __future__ import annotations

from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.kv_cache import blocks_for


def num_gpu_blocks_for(config: EngineConfig, kv_cache_bytes: int | None = None,
                       kv_bytes_per_token: int | None = None) -> int:
    """KV blocks per replica: the config's num_gpu_blocks if set; else from a KV size
    (the config's kv_cache_memory, else `kv_cache_bytes`, over `kv_bytes_per_token` x
    block_size, both given and non-zero);
    else enough for max_num_seqs sequences of max_model_len."""
    bs = config.cache.block_size
    if config.cache.num_gpu_blocks:
        return config.cache.num_gpu_blocks
    kv_cache_bytes = config.cache.kv_cache_memory or kv_cache_bytes  # the config's wins
    if kv_cache_bytes and kv_bytes_per_token:
        return kv_cache_bytes // (kv_bytes_per_token * bs)
    sc = config.scheduler
    return blocks_for(sc.max_model_len, bs) * sc.max_num_seqs + 1


def check_simulated_memory(config: EngineConfig) -> None:
    """swap_space and gpu_memory_utilization size a real engine's memory from the
    machine it runs on; the simulator has no such machine, so it refuses them rather
    than ignore them."""
    cache = config.cache
    for name, value in (("swap_space", cache.swap_space),
                        ("gpu_memory_utilization", cache.gpu_memory_utilization)):
        if value:
            raise ConfigError(f"{name} = {value:g}: sizes a real engine's memory; the "
                              "simulator takes num_gpu_blocks, num_cpu_blocks or "
                              "kv_cache_memory instead")
