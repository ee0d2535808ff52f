"""The paged KV block manager: device blocks of `block_size` tokens, a CPU swap pool,
and per-request block tables.

Invariant (checked by `check_integrity`): for each pool, free blocks + blocks referenced
by some block table == total blocks, a block is held (the pool's `held` set) iff exactly
one table holds it (blocks are never shared), and no block is both free and held.

Allocation is check-then-commit: a method that can run out of blocks returns False (or
an empty result) and changes nothing; a broken invariant raises.
"""

from __future__ import annotations

from stepserve.request import Request


class KVCacheError(RuntimeError):
    """An invariant of the block manager is broken (a bug, not a capacity problem)."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockPool:
    """A fixed set of block ids, each free or held by exactly one block table (blocks are
    never shared: there is no prefix caching), with a LIFO free list."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.held: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self.free)

    def take(self, n: int) -> list[int]:
        if n > len(self.free):
            raise KVCacheError(f"take({n}) with only {len(self.free)} free blocks")
        out = self.free[len(self.free) - n:]
        del self.free[len(self.free) - n:]
        self.held.update(out)
        return out

    def release(self, blocks: list[int]) -> None:
        # Set operations, not a loop: a finished request releases its whole table.
        held = self.held
        if not held.issuperset(blocks) or len(set(blocks)) != len(blocks):
            stray = sorted(set(blocks) - held) or sorted(b for b in blocks
                                                         if blocks.count(b) > 1)
            raise KVCacheError(f"block {stray[0]} released but not held (or released twice)")
        held.difference_update(blocks)
        self.free.extend(blocks)


class KVCacheManager:
    """Block tables for running (device) and swapped (CPU) requests."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 watermark: float = 0.0) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks = {num_gpu_blocks}: must be >= 1")
        self.block_size = block_size
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.block_tables: dict[str, list[int]] = {}  # request id -> device blocks
        self.cpu_tables: dict[str, list[int]] = {}  # request id -> CPU blocks (swapped)

    # ---- queries ----
    @property
    def num_gpu_blocks(self) -> int:
        return self.gpu.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.gpu.num_free

    @property
    def usage(self) -> float:
        """Share of device blocks in use, 0..1."""
        return 1.0 - self.gpu.num_free / self.gpu.num_blocks

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- device allocation ----
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       reserve_total: int = 0) -> bool:
        """Make room for `num_new_tokens` more tokens of `request` (and, when given, for
        `reserve_total` tokens in all). A request holding no blocks yet is new: it must
        leave the watermark free so running requests can still grow. False: no change."""
        rid = request.request_id
        table = self.block_tables.get(rid)
        have = len(table) if table else 0
        total = request.num_computed_tokens + num_new_tokens
        if reserve_total > total:
            total = reserve_total
        need = -(-total // self.block_size) - have
        if need <= 0:
            return True
        free = len(self.gpu.free)
        if need > free or (have == 0 and free - need < self.watermark_blocks):
            return False
        new = self.gpu.take(need)
        if table is None:
            self.block_tables[rid] = new
        else:
            table.extend(new)
        return True

    def free(self, request: Request) -> None:
        """Release every block `request` holds, on the device and in the CPU pool."""
        table = self.block_tables.pop(request.request_id, None)
        if table:
            self.gpu.release(table)
        cpu_table = self.cpu_tables.pop(request.request_id, None)
        if cpu_table:
            self.cpu.release(cpu_table)

    # ---- swapping ----
    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move `request`'s device blocks to the CPU pool; returns (device, cpu) copies.
        Empty list (and no change) if the CPU pool is too small."""
        table = self.block_tables.get(request.request_id, [])
        if not table or len(table) > self.cpu.num_free:
            return []
        cpu_blocks = self.cpu.take(len(table))
        self.cpu_tables[request.request_id] = cpu_blocks
        del self.block_tables[request.request_id]
        self.gpu.release(table)
        return list(zip(table, cpu_blocks))

    def can_swap_in(self, request: Request) -> bool:
        n = len(self.cpu_tables.get(request.request_id, ()))
        return n <= self.gpu.num_free - self.watermark_blocks

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Bring `request`'s blocks back to the device; returns (cpu, device) copies.
        Empty list (and no change) if the device has too few free blocks."""
        cpu_table = self.cpu_tables.get(request.request_id)
        if not cpu_table or not self.can_swap_in(request):
            return []
        dev = self.gpu.take(len(cpu_table))
        self.block_tables[request.request_id] = dev
        del self.cpu_tables[request.request_id]
        self.cpu.release(cpu_table)
        return list(zip(cpu_table, dev))

    # ---- invariants ----
    def check_integrity(self, full: bool = True) -> None:
        """Raise KVCacheError unless every block is exactly free or referenced by one
        table. `full=False` checks only the counts (free + held == total, and the tables
        reference as many blocks as are held): O(requests), cheap enough for every step;
        a leak or a double allocation changes a count. The full check compares the block
        sets themselves."""
        for name, pool, tables in (("device", self.gpu, self.block_tables),
                                   ("cpu", self.cpu, self.cpu_tables)):
            in_tables = sum(map(len, tables.values()))
            if len(pool.held) + len(pool.free) != pool.num_blocks or \
                    in_tables != len(pool.held):
                raise KVCacheError(f"{name}: free {len(pool.free)} + held {len(pool.held)} "
                                   f"!= total {pool.num_blocks}, or tables reference "
                                   f"{in_tables} blocks")
            if full:
                _check_pool(name, pool, tables)

    @property
    def all_free(self) -> bool:
        return (self.gpu.num_free == self.gpu.num_blocks
                and self.cpu.num_free == self.cpu.num_blocks)


def _check_pool(name: str, pool: BlockPool, tables: dict[str, list[int]]) -> None:
    referenced = [b for table in tables.values() for b in table]
    refs = set(referenced)
    if len(refs) != len(referenced):
        dup = next(b for b in referenced if referenced.count(b) > 1)
        raise KVCacheError(f"{name} block {dup}: {referenced.count(dup)} tables hold it")
    free = set(pool.free)
    if len(free) != len(pool.free):
        raise KVCacheError(f"{name} free list holds a block twice")
    if refs != pool.held:
        stray = sorted(refs ^ pool.held)[0]
        raise KVCacheError(f"{name} block {stray}: held={stray in pool.held} but "
                           f"{int(stray in refs)} tables hold it")
    both = free & refs
    if both:
        raise KVCacheError(f"{name} block {min(both)}: free and held by a table")
    if not free.union(refs) <= set(range(pool.num_blocks)):
        raise KVCacheError(f"{name}: a block id outside 0..{pool.num_blocks - 1}")
