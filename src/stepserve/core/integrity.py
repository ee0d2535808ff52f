"""The scheduler's integrity check: its queues and the KV manager's blocks agree. Run
after every step by the engine core while STEPSERVE_CHECK_INTEGRITY=1 (core/base.py), so
a leak, a double free or a lost request raises at the step that made it.

`full=False` checks counts only, O(requests): cheap enough for every step of a long
simulation; a leak or a double allocation changes a count. The full check compares the
sets themselves (which request, which block)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepserve.core.block_pool import KVCacheError

if TYPE_CHECKING:
    from stepserve.core.base import SchedulerBase


def check_scheduler(sched: SchedulerBase, full: bool = True) -> None:
    """Raise KVCacheError unless: the block manager's own invariant holds (reference
    counts, free queue, prefix cache names); every live request is in exactly one queue;
    exactly the running requests hold device blocks, covering their computed tokens (a
    prefix cache hit included), and exactly the swapped ones hold CPU blocks (a table
    left behind by an ended request is a leak)."""
    kv = sched.kv
    kv.check_integrity(full)
    live = sched.requests
    queues = (sched.waiting, sched.running, sched.swapped)
    queued = sum(map(len, queues))
    if queued != len(live) or (full and {r.request_id for q in queues for r in q}
                               != live.keys()):
        raise KVCacheError(f"queues hold {queued} requests, the live table {len(live)}, "
                           f"or they name different requests")
    if not (kv.block_tables.keys() <= live.keys() and kv.cpu_tables.keys() <= live.keys()):
        leaked = (kv.block_tables.keys() | kv.cpu_tables.keys()) - live.keys()
        raise KVCacheError(f"blocks held by ended or unknown request {sorted(leaked)[0]!r}")
    if len(kv.block_tables) != len(sched.running) or \
            len(kv.cpu_tables) != len(sched.swapped):
        raise KVCacheError(f"{len(kv.block_tables)} device tables for {len(sched.running)} "
                           f"running requests, {len(kv.cpu_tables)} CPU tables for "
                           f"{len(sched.swapped)} swapped ones")
    if not full:
        return
    bs = kv.block_size
    for req in sched.running:
        table = kv.block_tables.get(req.request_id)
        if table is None or req.num_computed_tokens > len(table) * bs:
            raise KVCacheError(f"running request {req.request_id!r}: "
                               f"{req.num_computed_tokens} tokens computed, its table "
                               f"holds {0 if table is None else len(table)} blocks")
