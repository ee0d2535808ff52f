"""The continuous-batching scheduler: the batch is re-formed every step.

One step (the seed's six steps, 1-4 here, 5-6 in update_from_output):
  1. expire requests that waited past max_queue_time_s;
  2. split the token budget (max_num_batched_tokens) between decode and prefill, in
     `budget_order`: decode_first serves running sequences before new prompts;
     prefill_first (legacy) serves prompts first, and a step that prefills leaves decode
     budget - chunk cap (the seed's "decode 预算 = 总预算 - 本步 prefill chunk");
  3. allocate KV blocks; when they run out, preempt a victim chosen by the policy
     (swap to the CPU pool, or drop and recompute later); new prompts just wait;
  4. hand the batch to the runner as a SchedulerOutput.

Token rule: a request needs `num_tokens - num_computed_tokens` more tokens computed. It is
*decoding* when exactly its newest sampled token is missing; anything else is prefill
(a fresh prompt, a chunk of one, or a recompute after preemption). A prefill chunk is
capped by long_prefill_token_threshold; at most max_num_partial_prefills prompts (and
max_long_partial_prefills long ones) may be left mid-prefill at once.
"""

from __future__ import annotations

from stepserve.core.base import SchedulerBase
from stepserve.core.output import SchedulerOutput
from stepserve.request import Request, RequestStatus

_RUNNING = RequestStatus.RUNNING
_DECODE, _PREFILL, _ANY = 1, 2, 3


class Scheduler(SchedulerBase):
    """Continuous batching (vLLM v1-style token budget, chunked prefill, preemption)."""

    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        out = self._new_output()
        if self.qc.max_queue_time_s and self.waiting:
            self._expire_waiting(now)
        out.slots_held = min(self.sc.max_num_seqs,
                             len(self.running) + len(self.waiting) + len(self.swapped))
        budget = self.sc.max_num_batched_tokens
        if self.sc.budget_order == "decode_first":
            budget = self._schedule_running(out, budget, _ANY, now)
            budget = self._schedule_swapped(out, budget, now)
            self._schedule_waiting(out, budget, now)
        else:
            budget = self._schedule_running(out, budget, _PREFILL, now)
            budget = self._schedule_waiting(out, budget, now)
            if out.num_prefill_tokens:
                # Legacy split: a step that prefills reserves a whole chunk for it, so
                # decode budget = budget - chunk cap. A cap equal to the budget leaves
                # decode nothing until no prompt is left (the seed's second incident).
                budget = min(budget, self.sc.max_num_batched_tokens
                             - max(out.num_prefill_tokens, self.sc.chunk_cap))
            budget = self._schedule_running(out, budget, _DECODE, now)
            self._schedule_swapped(out, budget, now)
        return out

    # ---- running sequences ----
    def _schedule_running(self, out: SchedulerOutput, budget: int, which: int,
                          now: float) -> int:
        running = self.running
        tables = self.kv.block_tables
        bs = self.kv.block_size
        chunked = self.sc.enable_chunked_prefill
        cap = self.sc.chunk_cap
        step = out.step_index
        i = 0
        while i < len(running):
            req = running[i]
            i += 1
            if req.sched_step == step:
                continue  # prefill_first: already scheduled in the prefill pass
            computed = req.num_computed_tokens
            num_output = len(req.output_token_ids)
            remaining = req.num_prompt_tokens + num_output - computed
            decoding = remaining == 1 and num_output > 0
            if decoding:
                if which == _PREFILL:
                    continue
                out.num_decode_ready += 1
                n = 1
            else:
                if which == _DECODE:
                    continue
                n = min(remaining, cap) if chunked else remaining
                if n > budget:
                    if not chunked:
                        continue
                    n = budget
            if budget <= 0 or n <= 0:
                continue
            table = tables.get(req.request_id)
            if table is None or computed + n > len(table) * bs:
                # Needs new blocks: preempt victims until it fits or it is the victim.
                while not self.kv.allocate_slots(req, n):
                    victim = self.policy.pick_victim(running, now)
                    j = running.index(victim)
                    budget += self._preempt(victim, out)
                    del running[j]
                    if j < i:
                        i -= 1
                    if victim is req:
                        break
                if req.status is not _RUNNING:
                    continue
            out.add(req, n, tables[req.request_id], decoding)
            budget -= n
        return budget

    def _preempt(self, victim: Request, out: SchedulerOutput) -> int:
        """Evict `victim` (swap, else recompute). Returns budget given back if it had
        already been scheduled this step."""
        if self.sc.preemption_mode == "none":
            raise RuntimeError("preemption_mode=none reserves every request's blocks at "
                               "admission, yet a running request ran out of blocks")
        given_back = 0
        if victim.sched_step == out.step_index:
            decoding = victim.num_tokens - victim.num_computed_tokens == 1 and \
                bool(victim.output_token_ids)
            given_back = out.remove(victim, decoding)
        victim.num_preemptions += 1
        self.num_preemptions_total += 1
        out.preempted.append(victim)
        if self.sc.preemption_mode == "swap":
            pairs = self.kv.swap_out(victim)
            if pairs:
                out.swap_out.extend(pairs)
                victim.num_swapped_out_blocks += len(pairs)
                victim.status = RequestStatus.SWAPPED
                self.swapped.append(victim)
                return given_back
        # recompute (or swap with a full CPU pool): drop the KV, keep the output so far.
        self.kv.free(victim)
        victim.num_recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        self.waiting.insert(0, victim)
        return given_back

    # ---- swapped sequences come back before new prompts ----
    def _schedule_swapped(self, out: SchedulerOutput, budget: int, now: float) -> int:
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
            remaining = req.num_tokens - req.num_computed_tokens
            decoding = remaining == 1 and bool(req.output_token_ids)
            n = 1 if decoding else min(remaining, self.sc.chunk_cap, budget)
            if decoding:
                out.num_decode_ready += 1
            if not self.kv.allocate_slots(req, n):
                continue  # back on the device; it runs next step
            out.add(req, n, self.kv.block_tables[req.request_id], decoding)
            budget -= n
        return budget

    # ---- new (and recompute-preempted) prompts ----
    def _partial_counts(self, step: int) -> tuple[int, int]:
        """Prompts that will still be mid-prefill after this step: (all, long)."""
        threshold = self.sc.long_prefill_token_threshold
        partial = long_partial = 0
        for req in self.running:
            left = req.num_tokens - req.num_computed_tokens
            if req.sched_step == step:
                left -= req.sched_tokens
            if left > 0 and not (left == 1 and req.output_token_ids):
                partial += 1
                if threshold and req.num_tokens > threshold:
                    long_partial += 1
        return partial, long_partial

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> int:
        if not self.waiting or out.preempted or budget <= 0:
            return budget
        sc = self.sc
        if len(self.running) >= sc.max_num_seqs:
            return budget
        if self.policy.sorts_waiting:
            self.policy.order_waiting(self.waiting, now)
        chunked = sc.enable_chunked_prefill
        threshold = sc.long_prefill_token_threshold
        reserve_all = sc.preemption_mode == "none"
        partial, long_partial = self._partial_counts(out.step_index) if chunked else (0, 0)
        admitted: list[Request] = []
        for req in self.waiting:
            if len(self.running) >= sc.max_num_seqs or budget <= 0:
                break
            remaining = req.num_tokens - req.num_computed_tokens
            is_long = threshold > 0 and req.num_tokens > threshold
            if chunked:
                n = min(remaining, sc.chunk_cap, budget)
                if n < remaining:  # it will be left mid-prefill
                    if partial >= sc.max_num_partial_prefills or \
                            (is_long and long_partial >= sc.max_long_partial_prefills):
                        continue  # let shorter prompts behind it go first
            else:
                n = remaining
                if n > budget:
                    break
            reserve = req.max_total_tokens if reserve_all else 0
            if not self.kv.allocate_slots(req, n, reserve):
                break  # no room: new prompts wait rather than evict anyone
            if n < remaining:
                partial += 1
                long_partial += is_long
            self._admit(req, now)
            admitted.append(req)
            out.add(req, n, self.kv.block_tables[req.request_id], decoding=False)
            budget -= n
        if admitted:
            k = len(admitted)
            if self.waiting[:k] == admitted:
                del self.waiting[:k]
            else:
                gone = set(map(id, admitted))
                self.waiting = [r for r in self.waiting if id(r) not in gone]
        return budget
