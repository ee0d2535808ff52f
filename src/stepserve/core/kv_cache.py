"""The paged KV block manager: pools of blocks shared by reference count (`BlockPool`),
a CPU swap pool, per-request block tables, and automatic prefix caching.

Prefix caching: a block whose tokens are all computed is cached (`cache_blocks`) and
stays in the pool after its request lets go until the pool needs it; a new request
starts from the longest run of named blocks matching its chain of names (prefix_hash.py,
`cached_prefix`). Blocks are named on demand: `cache_blocks` names only a table's first
block and files its `Chain` under that name; a lookup whose first block has that name
names the chains filed there first, so it sees exactly what naming every block at once
would give. A request only ever writes its own unshared blocks: at least its last token
is always computed, so a whole-prompt hit is cut back by one block.

Invariant (`check_integrity`): a block's reference count is the number of tables naming
it; the free queue is exactly the blocks with count 0; the name map holds exactly the
named blocks. A method that can run out of blocks returns False (or an empty result) and
changes nothing; a broken invariant raises KVCacheError.

In a pool a block is held (ref_cnt > 0: that many tables name it) or free
(in `free_queue`). A free block may still be named (`block_hash`) or marked to be named
on demand (`lazy`, its `Chain`): its KV is kept until `take` hands it out for new data
(an eviction). The free queue holds empty blocks first, then cached ones least recently
freed first; a table is released tail first, so a request's tail is evicted before its
head. Several blocks may carry one name: a lookup gives the lowest id (`cached`), the
others wait in `twins`, so which block a lookup gets never depends on naming order
(decode runs name blocks later than stepping does).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from itertools import chain
from operator import eq

from stepserve.core.prefix_hash import DEFAULT_HASH_ALGO, BlockHash, namer
from stepserve.core.request import Request


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


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Block tables for running (device) and swapped (CPU) requests; the prefix cache."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 watermark: float = 0.0, enable_prefix_caching: bool = True,
                 hash_algo: str = DEFAULT_HASH_ALGO) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks = {num_gpu_blocks}: must be >= 1")
        self.block_size = block_size
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.namer = namer(hash_algo)  # prefix_hash.py: what names a full block
        self.block_tables: dict[str, list[int]] = {}  # request id -> device blocks
        self.cpu_tables: dict[str, list[int]] = {}  # request id -> CPU blocks (swapped)
        # request id -> leading blocks of its table named (or marked to be)
        self.num_named: dict[str, int] = {}
        self.chain_of: dict[str, Chain] = {}  # request id -> its table's chain (on demand)
        self.chains: dict = {}  # a first block's name -> the chains filed under it, by id
        # vLLM's prefix_cache_queries / _hits, in tokens
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ---- queries ----
    @property
    def num_gpu_blocks(self) -> int:
        return self.gpu.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Free device blocks, evictable cached ones included."""
        return self.gpu.num_free

    @property
    def usage(self) -> float:
        """Share of device blocks held by some request, 0..1 (cached free blocks are free)."""
        return 1.0 - self.gpu.num_free / self.gpu.num_blocks

    @property
    def prefix_cache_evictions(self) -> int:
        return self.gpu.num_evictions

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- the prefix cache ----
    def cached_prefix(self, request: Request) -> list[int]:
        """The device blocks of the longest cached prefix of `request` (holding no
        blocks), leaving its last token to compute; empty with caching off or prompt
        logprobs asked (those positions must be computed to be scored)."""
        if not self.looks_up(request):
            return []
        bs = self.block_size
        limit = (request.num_tokens - 1) // bs
        hashes = request.block_hashes
        if limit:
            first = self.namer.names(request, 1, bs)[0]
            if first in self.chains:
                for chain in list(self.chains[first].values()):
                    self._name_chain(chain)
        lookup = self.gpu.cached.get
        hits: list[int] = []
        for i in range(limit):
            if i == len(hashes):  # named lazily: a miss ends the walk
                self.namer.names(request, i + 1, bs)
            b = lookup(hashes[i])
            if b is None:
                break
            hits.append(b)
        return hits

    def take_prefix_hit(self, request: Request, hit_tokens: int) -> None:
        """`request` was admitted holding `hit_tokens` cached tokens: it starts past them
        (every batching admits through here: one cache, one set of counters)."""
        request.num_computed_tokens += hit_tokens
        request.prefix_hit_tokens = hit_tokens
        if request.first_scheduled_time is None:  # its prompt's first admission: for usage
            request.num_cached_tokens = hit_tokens
            # first admissions only, as vLLM's counters (and usage) count
            if self.looks_up(request):
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += hit_tokens

    def looks_up(self, request: Request) -> bool:
        """Whether `request` may start from cached blocks (`cached_prefix`)."""
        return self.enable_prefix_caching and request.prompt_logprobs is None

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the full blocks of the first `num_tokens` (computed) tokens of `request`."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        full = num_tokens // self.block_size
        done = self.num_named.get(rid, 0)
        if full <= done:
            return
        table = self.block_tables[rid]
        chain = self.chain_of.get(rid)
        if chain is None:
            first = self.namer.names(request, 1, self.block_size)[0]
            chain = self.chain_of[rid] = Chain(request, table, first, self.chains)
        if chain.filed:  # nobody asked for its first block yet: named on demand
            self.gpu.mark_lazy(table, done, full, chain)
        else:
            self.gpu.name(table, self.namer.names(request, full, self.block_size), done, full)
        self.num_named[rid] = full

    def _name_chain(self, chain: Chain) -> None:
        """Name what `chain` holds unnamed; a live one's later blocks are named at once."""
        hi = len(chain.table)
        if chain.alive:
            req, bs = chain.request, self.block_size
            hi = min(hi, req.num_tokens // bs)
            self.gpu.name_chain(chain, self.namer.names(req, hi, bs), hi)
        chain.leave()

    # ---- device allocation ----
    def allocate_slots(self, request: Request, num_new_tokens: int, reserve_total: int = 0,
                       cached: list[int] | None = None) -> bool:
        """Make room for `num_new_tokens` more tokens of `request` (and for
        `reserve_total` in all, when given). `cached`: the hits `cached_prefix` found for
        a request holding no blocks, first in its table (free ones count like new
        blocks). A request holding no blocks must leave the watermark free, unless no
        request holds any. False: no change."""
        rid = request.request_id
        table = self.block_tables.get(rid)
        have = len(table) if table else 0
        hits = cached or ()
        total = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        if reserve_total > total:
            total = reserve_total
        need = -(-total // self.block_size) - have - len(hits)
        if need <= 0 and not hits:
            return True
        gpu = self.gpu
        cost = max(need, 0)
        if hits:
            ref = gpu.ref_cnt
            cost += sum(1 for b in hits if ref[b] == 0)
        free = gpu.num_free
        if cost > free:
            return False
        if have == 0 and free - cost < self.watermark_blocks and gpu.num_held:
            return False
        if hits:
            if table is not None:
                raise KVCacheError(f"request {rid}: a cache hit for a request holding blocks")
            gpu.touch(hits)
            self.num_named[rid] = len(hits)
        new = gpu.take(need) if need > 0 else []
        if table is None:
            self.block_tables[rid] = [*hits, *new]
        else:
            table.extend(new)
        return True

    def free(self, request: Request) -> None:
        """Release every block `request` holds; its computed device blocks stay cached."""
        rid = request.request_id
        if rid in self.block_tables:
            self._let_go(request)
        cpu_table = self.cpu_tables.pop(rid, None)
        if cpu_table:
            self.cpu.release(cpu_table)
        if request.is_finished:
            request.block_hashes.clear()

    def _let_go(self, request: Request) -> list[int]:
        """Release `request`'s device table (returned), naming first what a decode run
        left unnamed."""
        self.cache_blocks(request, min(request.num_computed_tokens, request.num_tokens))
        rid = request.request_id
        self.num_named.pop(rid, None)
        chain = self.chain_of.pop(rid, None)
        if chain is not None:  # its marked blocks stay cached, filed under its first name
            chain.live = False
            chain.lose(0)
        table = self.block_tables.pop(rid)
        self.gpu.release(table)
        return table

    # ---- swapping ----
    # A swapped request keeps a CPU copy of every block, shared or not; swapping in takes
    # fresh device blocks, named again as steps complete (twins of cached originals).
    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Move `request`'s blocks to the CPU pool: the (device, cpu) copies, to run before
        the released blocks are written; empty (no change) if the pool is too small."""
        rid = request.request_id
        table = self.block_tables.get(rid, [])
        if not table or len(table) > self.cpu.num_free:
            return []
        cpu_blocks = self.cpu.take(len(table))
        self.cpu_tables[rid] = cpu_blocks
        return list(zip(self._let_go(request), cpu_blocks))

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Bring `request`'s blocks back: the (cpu, device) copies; empty (no change)
        without room above the watermark (unless no request holds blocks)."""
        cpu_table = self.cpu_tables.get(request.request_id)
        n, free = len(cpu_table or ()), self.gpu.num_free
        room = n <= free - self.watermark_blocks or (n <= free and not self.gpu.num_held)
        if not n or not room:
            return []
        dev = self.gpu.take(len(cpu_table))
        self.block_tables[request.request_id] = dev
        del self.cpu_tables[request.request_id]
        self.cpu.release(cpu_table)
        return list(zip(cpu_table, dev))

    # ---- invariants ----
    def check_integrity(self, full: bool = True) -> None:
        """Raise KVCacheError unless the pools and the tables agree; `full=False`: the
        counts only, O(requests) (a leak or a double allocation changes a count)."""
        for name, pool, tables in (("device", self.gpu, self.block_tables),
                                   ("cpu", self.cpu, self.cpu_tables)):
            if full:
                pool.check(name, list(tables.values()))
            else:
                pool.check_counts(name, tables.values())
        stray = (self.num_named.keys() | self.chain_of.keys()) - self.block_tables.keys()
        if stray:
            raise KVCacheError(f"named-block count kept for request {min(stray)!r}, which "
                               f"holds no device blocks")

    @property
    def all_free(self) -> bool:
        """No block is held (cached free blocks may remain)."""
        return (self.gpu.num_free == self.gpu.num_blocks
                and self.cpu.num_free == self.cpu.num_blocks)
