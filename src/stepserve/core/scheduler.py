"""The continuous-batching scheduler: the batch is re-formed every step, in the order
of its budget order (decode_first, or the legacy prefill_first) and its preemption mode.

A step: expire queue timeouts (SchedulerBase.schedule); split max_num_batched_tokens
between running sequences, swapped ones and new prompts in the budget order's sequence;
allocate KV blocks, preempting the policy's victim when they run out (new prompts just
wait); hand the batch to the runner. A request needs `num_tokens - num_computed_tokens`
tokens computed, a new prompt starting past its cached prefix; a prefill chunk is capped
by long_prefill_token_threshold, and at most max_num_partial_prefills prompts
(max_long_partial_prefills long ones) are left mid-prefill at once.
"""

from __future__ import annotations

from stepserve.config.settings import EngineConfig, SchedulerConfig
from stepserve.core.base import SchedulerBase
from stepserve.core.clock import Clock
from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.prefix_hash import BlockHash, BlockNamer
from stepserve.core.request import Request, RequestStatus, is_decoding

_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.SWAPPED


# ---- the budget order: which named steps get a step's token budget first ----
class BudgetOrder:
    """Interface: `fill` runs the scheduler's named steps in order, passing the budget
    on. Every order serves every decode of a step where nothing waits or is swapped and
    all running requests decode (core/decode_run.py relies on it)."""

    name = ""

    def __init__(self, sc: SchedulerConfig) -> None:
        self.max_num_batched_tokens = sc.max_num_batched_tokens
        self.chunk_cap = sc.chunk_cap

    def fill(self, steps: Scheduler, out: SchedulerOutput, now: float) -> None:
        raise NotImplementedError


class DecodeFirst(BudgetOrder):
    """Running sequences (in admission order), then swapped ones, then new prompts."""

    name = "decode_first"

    def fill(self, steps: Scheduler, out: SchedulerOutput, now: float) -> None:
        budget = steps.schedule_running(out, self.max_num_batched_tokens, now)
        budget = steps.schedule_swapped(out, budget, now)
        steps.schedule_waiting(out, budget, now)


class PrefillFirst(BudgetOrder):
    """Legacy: prompts first (running chunks, then new ones), then decodes under
    "decode 预算 = 总预算 - 本步 prefill chunk", then swapped ones."""

    name = "prefill_first"

    def fill(self, steps: Scheduler, out: SchedulerOutput, now: float) -> None:
        budget = steps.schedule_running(out, self.max_num_batched_tokens, now, decodes=False)
        budget = steps.schedule_waiting(out, budget, now)
        budget = self.decode_budget(budget, out.num_prefill_tokens)
        budget = steps.schedule_running(out, budget, now, prefills=False)
        steps.schedule_swapped(out, budget, now)

    def decode_budget(self, budget: int, num_prefill_tokens: int) -> int:
        """A step that prefills reserves a whole chunk: a cap equal to the budget leaves
        decode nothing while prompts remain (the mixed-pool incident)."""
        if not num_prefill_tokens:
            return budget
        return min(budget, self.max_num_batched_tokens
                   - max(num_prefill_tokens, self.chunk_cap))


BUDGET_ORDERS: dict[str, type[BudgetOrder]] = {
    order.name: order for order in (DecodeFirst, PrefillFirst)}


def _named(setting: str, table: dict, name: str):
    if name not in table:
        raise ValueError(f"{setting} = {name!r}: must be one of {', '.join(table)}")
    return table[name]


def make_budget_order(name: str, sc: SchedulerConfig) -> BudgetOrder:
    """The budget order called `name`, with the budget and chunk cap of `sc`."""
    return _named("budget_order", BUDGET_ORDERS, name)(sc)


# ---- the preemption mode: what happens to a victim's KV ----
class Preemption:
    """Interface. `evict` takes `victim`'s KV off the device and returns the status it
    waits in (SWAPPED or PREEMPTED), before any other bookkeeping."""

    name = ""
    reserves_worst_case = False  # admission reserves prompt + max_tokens: no victims

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        raise NotImplementedError


class Recompute(Preemption):
    """Drop the KV; the recompute prefills prompt + output so far and resumes."""

    name = "recompute"

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        kv.free(victim)
        victim.num_recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        return RequestStatus.PREEMPTED


class Swap(Recompute):
    """Copy the KV to the CPU pool (`out.swap_out`); recompute when it has no room."""

    name = "swap"

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        pairs = kv.swap_out(victim)
        if not pairs:
            return super().evict(victim, kv, out)
        out.swap_out.extend(pairs)
        victim.num_swapped_out_blocks += len(pairs)
        return RequestStatus.SWAPPED


class NoPreemption(Preemption):
    """Never evict: admission reserves each request's worst case instead."""

    name = "none"
    reserves_worst_case = True

    def evict(self, victim: Request, kv: KVCacheManager, out: SchedulerOutput) -> RequestStatus:
        raise RuntimeError("preemption_mode=none reserves every request's blocks at "
                           "admission, yet a running request ran out of blocks")


PREEMPTIONS: dict[str, type[Preemption]] = {
    mode.name: mode for mode in (Recompute, Swap, NoPreemption)}


def make_preemption(name: str) -> Preemption:
    return _named("preemption_mode", PREEMPTIONS, name)()


class InFlightBlocks:
    """The names of the full blocks this step's prefill chunks compute (gathered as the
    batch grows). A waiting prompt whose next uncached block is among them waits a step
    and finds it cached, as SGLang defers such prompts (32 prompts sharing 48 tokens:
    560 prompt tokens computed instead of 2048)."""

    def __init__(self, out: SchedulerOutput, block_size: int, namer: BlockNamer) -> None:
        self.out = out
        self.block_size = block_size
        self.namer = namer
        self.names: set[BlockHash] = set()
        self.seen = 0  # entries of out.requests gathered so far

    def holds_next_block_of(self, req: Request, num_hits: int) -> bool:
        """Whether `req`'s block after its `num_hits` cached ones (not its last) is
        computed this step."""
        bs = self.block_size
        if (num_hits + 1) * bs >= req.num_tokens or num_hits >= len(req.block_hashes):
            return False
        out = self.out
        for r, n in zip(out.requests[self.seen:], out.num_scheduled_tokens[self.seen:]):
            if n > 1:  # a prefill chunk (a decode fills no block another prompt starts with)
                lo, hi = r.num_computed_tokens // bs, (r.num_computed_tokens + n) // bs
                if hi > lo:
                    self.names.update(self.namer.names(r, hi, bs)[lo:hi])
        self.seen = len(out.requests)
        return req.block_hashes[num_hits] in self.names


class Scheduler(SchedulerBase):
    """Continuous batching (vLLM v1-style token budget, chunked prefill, preemption)."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, clock: Clock) -> None:
        super().__init__(config, kv, clock)
        self.budget_order = make_budget_order(self.sc.budget_order, self.sc)
        self.preemption = make_preemption(self.sc.preemption_mode)

    def fill(self, out: SchedulerOutput, now: float) -> None:
        out.slots_held = min(self.sc.max_num_seqs,
                             len(self.running) + len(self.waiting) + len(self.swapped))
        self.budget_order.fill(self, out, now)

    # ---- running sequences ----
    def schedule_running(self, out: SchedulerOutput, budget: int, now: float,
                         decodes: bool = True, prefills: bool = True) -> int:
        """One walk over `running` in admission order: a decode gets 1 token, a prefill
        its next chunk; blocks that run out are made by preempting (_make_room)."""
        tables = self.kv.block_tables
        bs = self.kv.block_size
        chunked = self.sc.enable_chunked_prefill
        cap = self.sc.chunk_cap
        step = out.step_index
        add = out.add
        add_request, add_count = out.requests.append, out.num_scheduled_tokens.append
        num_decode_ready = num_decodes = 0
        # Walk a snapshot, skipping victims (status read only once _make_room ran: ~25 ns
        # a request)
        made_room = False
        for req in self.running[:]:
            if req.sched_step == step or (made_room and req.status is not _RUNNING):
                continue  # scheduled in an earlier pass of this step, or a victim
            computed, num_output = req.num_computed_tokens, len(req.output_token_ids)
            if num_output and req.num_prompt_tokens + num_output - computed == 1:
                # decoding (Request.is_decoding, written out: the walk's hottest test)
                if not decodes:
                    continue
                num_decode_ready += 1
                if budget <= 0:
                    continue
                # The common case, first: its next token fits in the blocks it holds.
                table = tables[req.request_id]
                if computed < len(table) * bs:
                    # out.add(req, 1, True) written out: a simulation's hottest lines
                    req.sched_step = step
                    req.sched_tokens = 1
                    add_request(req)
                    add_count(1)
                    num_decodes += 1
                    budget -= 1
                    continue
                n, decoding = 1, True
            else:
                if not prefills:
                    continue
                remaining = req.num_tokens - req.num_computed_tokens
                n = min(remaining, cap) if chunked else remaining
                if n > budget:
                    if not chunked:
                        continue
                    n = budget
                if budget <= 0 or n <= 0:
                    continue
                decoding = False
                table = tables.get(req.request_id)
                if table is not None and req.num_computed_tokens + n <= len(table) * bs:
                    add(req, n, False)
                    budget -= n
                    continue
            out.num_decode_tokens += num_decodes  # before a victim's tokens come out
            num_decodes = 0
            budget += self._make_room(req, n, out, now)
            made_room = True
            if req.status is not _RUNNING:
                continue  # it was the victim itself
            add(req, n, decoding)
            budget -= n
        out.num_decode_ready += num_decode_ready
        out.num_decode_tokens += num_decodes
        return budget

    def _make_room(self, req: Request, n: int, out: SchedulerOutput, now: float) -> int:
        """Allocate `n` more tokens of `req`, preempting the policy's victims until they
        fit or `req` is the victim; returns the budget given back."""
        given_back = 0
        while not self.kv.allocate_slots(req, n):
            victim = self.policy.pick_victim(self.running, now)
            given_back += self._preempt(victim, out)
            self.running.remove(victim)
            if victim is req:
                break
        return given_back

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Evict `victim` and queue it to come back; returns its tokens if it had been
        scheduled this step."""
        scheduled = victim.sched_step == out.step_index
        # Read before evicting: a recompute resets num_computed_tokens.
        decoding = scheduled and is_decoding(victim)
        victim.status = self.preemption.evict(victim, self.kv, out)  # none: raises
        victim.num_preemptions += 1
        self.num_preemptions_total += 1
        out.preempted.append(victim)
        if victim.status is _SWAPPED:
            self.swapped.append(victim)
        else:  # recomputed: first in line, it already waited its turn once
            self.waiting.insert(0, victim)
        return out.remove(victim, decoding) if scheduled else 0

    # ---- swapped sequences come back before new prompts ----
    def schedule_swapped(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Swap requests back in, oldest first, while slots, budget and blocks allow; not
        in a step that preempted."""
        if not self.swapped or out.preempted:
            return budget
        max_seqs = self.sc.max_num_seqs
        while self.swapped and len(self.running) < max_seqs and budget > 0:
            req = self.swapped[0]
            pairs = self.kv.swap_in(req)
            if not pairs:
                break
            out.swap_in.extend(pairs)
            del self.swapped[0]
            self._admit(req, now)
            decoding = is_decoding(req)
            if decoding:
                out.num_decode_ready += 1
                n = 1
            else:
                n = min(req.num_tokens - req.num_computed_tokens, self.sc.chunk_cap, budget)
            if not self.kv.allocate_slots(req, n):
                continue  # back on the device; it runs next step
            out.add(req, n, decoding)
            budget -= n
        return budget

    # ---- new (and recompute-preempted) prompts ----
    def _partial_counts(self, step: int) -> tuple[int, int]:
        """Prompts that will still be mid-prefill after this step: (all, long)."""
        threshold = self.sc.long_prefill_token_threshold
        partial = long_partial = 0
        for req in self.running:
            if req.sched_step == step:
                # is_decoding once this step's chunk is computed
                left = req.num_tokens - req.num_computed_tokens - req.sched_tokens
                mid_prefill = left > 1 or (left == 1 and not req.output_token_ids)
            else:
                mid_prefill = req.num_tokens > req.num_computed_tokens and \
                    not is_decoding(req)
            if mid_prefill:
                partial += 1
                if threshold and req.num_tokens - req.prefix_hit_tokens > threshold:
                    long_partial += 1
        return partial, long_partial

    def schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Admit waiting prompts in the policy's order while slots, budget, partial-prefill
        limits and blocks allow; not in a step that preempted."""
        if not self.waiting or out.preempted or budget <= 0:
            return budget
        sc = self.sc
        if len(self.running) >= sc.max_num_seqs:
            return budget
        if self.policy.sorts_waiting:
            self.policy.order_waiting(self.waiting, now)
        chunked = sc.enable_chunked_prefill
        threshold = sc.long_prefill_token_threshold
        reserve_all = self.preemption.reserves_worst_case
        kv = self.kv
        bs = kv.block_size
        in_flight = InFlightBlocks(out, bs, kv.namer) if kv.enable_prefix_caching else None
        # prompts left mid-prefill: counted only once a chunk needs them (-1 until then)
        partial = long_partial = -1
        admitted: list[Request] = []
        for req in self.waiting:
            if len(self.running) >= sc.max_num_seqs or budget <= 0:
                break
            hits = kv.cached_prefix(req)
            if in_flight is not None and kv.looks_up(req) and \
                    in_flight.holds_next_block_of(req, len(hits)):
                continue  # cached next step: see InFlightBlocks
            hit_tokens = len(hits) * bs
            remaining = req.num_tokens - req.num_computed_tokens - hit_tokens
            is_long = threshold > 0 and req.num_tokens - hit_tokens > threshold
            if chunked:
                n = min(remaining, sc.chunk_cap, budget)
                if n < remaining:  # it will be left mid-prefill
                    if partial < 0:
                        partial, long_partial = self._partial_counts(out.step_index)
                    if partial >= sc.max_num_partial_prefills or \
                            (is_long and long_partial >= sc.max_long_partial_prefills):
                        continue  # let shorter prompts behind it go first
            else:
                n = remaining
                if n > budget:
                    break
            reserve = req.max_total_tokens if reserve_all else 0
            if not kv.allocate_slots(req, n, reserve, hits):
                break  # no room: new prompts wait rather than evict anyone
            kv.take_prefix_hit(req, hit_tokens)
            if n < remaining:
                partial += 1
                long_partial += is_long
            self._admit(req, now)
            admitted.append(req)
            # a prefill, unless a recompute found all but its newest token cached
            out.add(req, n, decoding=n == 1 and is_decoding(req))
            budget -= n
        if admitted:
            k = len(admitted)
            if self.waiting[:k] == admitted:
                del self.waiting[:k]
            else:
                gone = set(map(id, admitted))
                self.waiting = [r for r in self.waiting if id(r) not in gone]
        return budget
