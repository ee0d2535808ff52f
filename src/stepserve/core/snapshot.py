"""What a driver may read of an engine core's state between steps (`EngineCore.snapshot`):
queue lengths, KV block counts and the prefix cache's counters, for /health, the
server's metrics, a replica's routing view and the demo. Drivers read this, never the
scheduler or its KV manager, so the core can change how it keeps them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    num_running: int
    num_waiting: int
    num_swapped: int
    num_gpu_blocks: int
    num_gpu_blocks_used: int  # held by some request (cached free blocks are free)
    kv_usage: float  # num_gpu_blocks_used / num_gpu_blocks, 0..1
    num_cpu_blocks: int
    num_cpu_blocks_used: int  # holding swapped-out requests
    num_preemptions_total: int
    # the prefix cache's counters, in tokens (vLLM's prefix_cache_queries / _hits)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def num_queued(self) -> int:
        """Requests waiting for a slot: not yet running, or swapped out."""
        return self.num_waiting + self.num_swapped

    @property
    def all_free(self) -> bool:
        """No block is held, on the device or in the CPU pool."""
        return self.num_gpu_blocks_used == 0 and self.num_cpu_blocks_used == 0
