"""A pool of KV blocks shared by reference count, with the prefix cache's names and LRU.

A block is held (ref_cnt > 0: that many tables name it) or free (in `free_queue`). A
free block may still be named (`block_hash`) or marked to be named on demand (`lazy`,
its `Chain`): its KV is kept, and a request whose prefix has that name takes it back
(`touch`) until `take` hands it out for new data (an eviction). The free queue holds
empty blocks first, then cached ones least recently freed first; a table is released
tail first, so a request's tail is evicted before its head. Several blocks may carry
one name: a lookup gives the lowest id (`cached`), the others wait in `twins`, so which
block a lookup gets never depends on naming order (decode runs name blocks later than
stepping does). Breaking an invariant raises KVCacheError.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from itertools import chain
from operator import eq

from stepserve.core.prefix_hash import BlockHash


class KVCacheError(RuntimeError):
    """An invariant of the block manager is broken (a bug, not a capacity problem)."""


class Chain:
    """One table's computed blocks to be named only when asked for: its request, the
    table, how many blocks still hold that content unnamed (`alive`); once no request's
    (`live` False) and empty, it leaves its registry bucket."""

    __slots__ = ("request", "table", "first", "alive", "live", "filed", "registry")

    def __init__(self, request: object, table: list[int], first: BlockHash,
                 registry: dict[BlockHash, dict[int, Chain]]) -> None:
        self.request, self.table, self.first = request, table, first
        self.alive = 0
        self.live = True
        self.filed = True  # in its registry bucket: its blocks are named on demand
        self.registry = registry
        registry.setdefault(first, {})[id(self)] = self

    def lose(self, n: int = 1) -> None:
        """`n` of its blocks no longer hold its content unnamed (evicted, or named)."""
        self.alive -= n
        if not self.alive and not self.live:
            self.leave()

    def leave(self) -> None:
        self.filed = False
        bucket = self.registry.get(self.first)
        if bucket is not None and bucket.pop(id(self), None) is not None and not bucket:
            del self.registry[self.first]


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_held = 0  # blocks with ref_cnt > 0
        self.num_refs = 0  # sum of ref_cnt: table entries naming this pool's blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}  # name -> its lowest-id block
        self.twins: dict[BlockHash, list[int]] = {}  # name -> its other blocks
        self.num_named = 0
        # a block whose KV is computed but not yet named: the chain it belongs to
        self.lazy: list[Chain | None] = [None] * num_blocks
        self.num_lazy = 0
        self.num_evictions = 0  # cached blocks (named or lazy) taken for new data

    @property
    def num_free(self) -> int:
        """Free blocks, named (evictable) ones included."""
        return len(self.free_queue)

    @property
    def free(self) -> list[int]:
        """The free block ids in the order `take` hands them out."""
        return list(self.free_queue)

    # ---- handing blocks out and back ----
    # The simulator's hot path: plain loops with the common case written out (they beat
    # map() over bound methods in CPython 3.11; benchmarks/sim_speed.py).
    def take(self, n: int) -> list[int]:
        """`n` blocks from the head of the free queue, held once each; a named one is
        evicted (its name dropped)."""
        queue = self.free_queue
        if n > len(queue):
            raise KVCacheError(f"take({n}) with only {len(queue)} free blocks")
        pop, names, ref, lazy = queue.popitem, self.block_hash, self.ref_cnt, self.lazy
        cached, twins = self.cached, self.twins
        out = []
        evicted = inline = lost = 0
        for _ in range(n):
            b = pop(last=False)[0]
            h = names[b]
            if h is not None:
                evicted += 1
                if h in twins:
                    self._drop_name(b)
                else:  # the common eviction, written out: the name's only block
                    del cached[h]
                    names[b] = None
                    inline += 1
            else:
                chain = lazy[b]
                if chain is not None:  # cached, never named: nothing to drop but the mark
                    lazy[b] = None
                    chain.lose()
                    lost += 1
            ref[b] = 1
            out.append(b)
        self.num_evictions += evicted + lost
        self.num_named -= inline
        self.num_lazy -= lost
        self.num_held += n
        self.num_refs += n
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Hold `blocks` once more each (a prefix cache hit); a free one leaves the queue."""
        ref, queue = self.ref_cnt, self.free_queue
        k = 0
        for b in blocks:
            if ref[b] == 0:
                del queue[b]
                self.num_held += 1
            ref[b] += 1
            k += 1
        self.num_refs += k

    def release(self, blocks: list[int]) -> None:
        """Drop one hold on each of `blocks` (one table's), last first; a block nobody
        holds joins the free queue (cached: at the tail; empty: at the head)."""
        ref, queue, names, lazy = self.ref_cnt, self.free_queue, self.block_hash, self.lazy
        if not all(map(ref.__getitem__, blocks)):
            stray = next(b for b in blocks if ref[b] <= 0)
            raise KVCacheError(f"block {stray} released but not held")
        freed = 0
        for b in reversed(blocks):
            left = ref[b] - 1
            ref[b] = left
            if left == 0:
                queue[b] = None
                if names[b] is None and lazy[b] is None:  # holds nothing anyone could ask for
                    queue.move_to_end(b, last=False)
                freed += 1
            elif left < 0:
                raise KVCacheError(f"block {b} released twice")
        self.num_held -= freed
        self.num_refs -= len(blocks)

    # ---- names ----
    def name(self, blocks: list[int], hashes: list[BlockHash], lo: int, hi: int) -> None:
        """Name held blocks `blocks[lo:hi]` by `hashes[lo:hi]` (computed: shareable)."""
        names, cached = self.block_hash, self.cached
        named = 0
        for i in range(lo, hi):
            b, h = blocks[i], hashes[i]
            current = names[b]
            if current is not None:
                if current != h:
                    raise KVCacheError(f"block {b} is named twice, by different prefixes")
                continue
            names[b] = h
            named += 1
            first = cached.get(h)
            if first is None:
                cached[h] = b
            elif b < first:
                cached[h] = b
                self.twins.setdefault(h, []).append(first)
            else:
                self.twins.setdefault(h, []).append(b)
        self.num_named += named

    def mark_lazy(self, blocks: list[int], lo: int, hi: int, chain: Chain) -> None:
        """Mark held blocks `blocks[lo:hi]` as `chain`'s, named on demand (`name_chain`)."""
        names, lazy = self.block_hash, self.lazy
        k = 0
        for i in range(lo, hi):
            b = blocks[i]
            if names[b] is None and lazy[b] is None:
                lazy[b] = chain
                k += 1
        chain.alive += k
        self.num_lazy += k

    def name_chain(self, chain: Chain, hashes: list[BlockHash], hi: int) -> None:
        """Name by `hashes` the blocks of `chain.table[:hi]` still marked as its."""
        table, lazy = chain.table, self.lazy
        mine = [i for i in range(min(hi, len(table))) if lazy[table[i]] is chain]
        for i in mine:
            lazy[table[i]] = None
        self.num_lazy -= len(mine)
        chain.lose(len(mine))
        for i in mine:
            self.name(table, hashes, i, i + 1)

    def _drop_name(self, b: int) -> None:
        h = self.block_hash[b]
        assert h is not None
        self.block_hash[b] = None
        self.num_named -= 1
        others = self.twins.get(h)
        if self.cached[h] == b:
            if others:
                self.cached[h] = nxt = min(others)
                others.remove(nxt)
            else:
                del self.cached[h]
        else:
            assert others is not None
            others.remove(b)
        if others is not None and not others:
            del self.twins[h]

    # ---- invariants ----
    def check_counts(self, name: str, tables: Iterable[list[int]]) -> None:
        """O(tables): the counters agree with each other and with the tables' lengths."""
        entries = sum(map(len, tables))
        if self.num_held + len(self.free_queue) != self.num_blocks or \
                entries != self.num_refs:
            raise KVCacheError(f"{name}: free {len(self.free_queue)} + held {self.num_held} "
                               f"!= total {self.num_blocks}, or tables name {entries} blocks "
                               f"against {self.num_refs} references")
        if self.num_blocks - self.lazy.count(None) != self.num_lazy:
            raise KVCacheError(f"{name}: {self.num_lazy} blocks to be named on demand, "
                               f"{self.num_blocks - self.lazy.count(None)} marked")
        if len(self.cached) + sum(map(len, self.twins.values())) != self.num_named:
            raise KVCacheError(f"{name}: {self.num_named} named blocks, the name map has "
                               f"{len(self.cached)} names and "
                               f"{sum(map(len, self.twins.values()))} twins")

    def check(self, name: str, tables: list[list[int]]) -> None:
        """The full check: counts against the tables, the free queue against the held
        blocks, the name map against the blocks' names (C-speed passes over the pool)."""
        self.check_counts(name, tables)
        counts = Counter(chain.from_iterable(tables))
        for table in tables:
            if len(set(table)) != len(table):
                dup = next(b for b in table if table.count(b) > 1)
                raise KVCacheError(f"{name} block {dup}: one table names it twice")
        ids = counts.keys() | self.free_queue.keys()
        if ids and (min(ids) < 0 or max(ids) >= self.num_blocks):
            raise KVCacheError(f"{name}: a block id outside 0..{self.num_blocks - 1}")
        ref = self.ref_cnt
        if list(map(ref.__getitem__, counts)) != list(counts.values()):
            b = next(b for b, c in counts.items() if ref[b] != c)
            raise KVCacheError(f"{name} block {b}: count {ref[b]} but {counts[b]} tables "
                               f"hold it")
        if sum(ref) != self.num_refs or min(ref, default=0) < 0:
            b = next(b for b in range(self.num_blocks) if ref[b] and b not in counts)
            raise KVCacheError(f"{name} block {b}: count {ref[b]} but no table holds it")
        if len(counts) + len(self.free_queue) != self.num_blocks or \
                any(map(counts.__contains__, self.free_queue)):
            both = sorted(counts.keys() & self.free_queue.keys())
            raise KVCacheError(f"{name} block {both[0] if both else '?'}: free and held "
                               f"by a table (or neither)")
        names, cached = self.block_hash, self.cached
        if not all(map(eq, map(names.__getitem__, cached.values()), cached.keys())):
            b = next(b for h, b in cached.items() if names[b] != h)
            raise KVCacheError(f"{name} block {b}: the name map points at it, its name differs")
        for h, others in self.twins.items():
            if h not in cached or min(others) < cached[h] or \
                    any(names[b] != h for b in others):
                raise KVCacheError(f"{name}: the twins of a name disagree with the name map")
        mapped = set(cached.values()).union(*self.twins.values())
        if self.num_blocks - names.count(None) != self.num_named or \
                len(mapped) != self.num_named:
            raise KVCacheError(f"{name}: {self.num_blocks - names.count(None)} blocks carry "
                               f"a name, {self.num_named} are in the name map")
