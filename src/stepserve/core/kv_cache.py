"""The paged KV block manager: device blocks shared by reference count (block_pool.py),
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
changes nothing; a broken invariant raises.
"""

from __future__ import annotations

from stepserve.core.block_pool import BlockPool, Chain, KVCacheError
from stepserve.core.prefix_hash import DEFAULT_HASH_ALGO, namer
from stepserve.core.request import Request

__all__ = ["BlockPool", "KVCacheError", "KVCacheManager", "blocks_for"]


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
