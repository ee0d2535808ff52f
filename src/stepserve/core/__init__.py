"""The scheduling core: no torch, runs on any clock."""

from __future__ import annotations

from stepserve.config.settings import EngineConfig
from stepserve.core.base import SchedulerBase
from stepserve.core.baselines import DynamicBatchScheduler, StaticBatchScheduler
from stepserve.core.clock import Clock
from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.scheduler import Scheduler

SCHEDULERS: dict[str, type[SchedulerBase]] = {
    "continuous": Scheduler, "static": StaticBatchScheduler, "dynamic": DynamicBatchScheduler}


def make_scheduler(config: EngineConfig, clock: Clock, num_gpu_blocks: int) -> SchedulerBase:
    """The scheduler for `config.scheduler.batching`, with its own KV block manager."""
    cache = config.cache
    kv = KVCacheManager(num_gpu_blocks, cache.block_size, cache.num_cpu_blocks, cache.watermark,
                        cache.enable_prefix_caching, cache.prefix_caching_hash_algo)
    return SCHEDULERS[config.scheduler.batching](config, kv, clock)
