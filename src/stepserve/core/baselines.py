"""Baselines behind the same interface. Static batching takes up to max_num_seqs waiting
requests as one batch and runs it until its last member ends (early finishers' slots
stay empty); dynamic batching closes a batch only at max_num_seqs waiting or once the
oldest has waited batch_window_s. A batch reserves prompt + max_tokens of KV per member
(nothing is preempted), shares cached prefixes, prefills first, then decodes in
lock-step.
"""

from __future__ import annotations

from stepserve.core.base import SchedulerBase
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request


class StaticBatchScheduler(SchedulerBase):
    batch_size = 0  # members of the current batch, finished ones included

    def _batch_ready(self, now: float) -> bool:
        return bool(self.waiting)

    def _form_batch(self, now: float) -> None:
        if self.policy.sorts_waiting:
            self.policy.order_waiting(self.waiting, now)
        kv = self.kv
        taken = 0
        for req in self.waiting:
            if taken >= self.sc.max_num_seqs:
                break
            # Members start past their cached prefix, as under continuous batching. Twins
            # in one batch do not hit each other: their blocks are computed together.
            hits = kv.cached_prefix(req)
            if not kv.allocate_slots(req, 0, reserve_total=req.max_total_tokens,
                                     cached=hits):
                break
            kv.take_prefix_hit(req, len(hits) * kv.block_size)
            self._admit(req, now)
            taken += 1
        del self.waiting[:taken]
        self.batch_size = taken

    def fill(self, out: SchedulerOutput, now: float) -> None:
        if not self.running:
            self.batch_size = 0
            if self._batch_ready(now):
                self._form_batch(now)
        out.slots_held = self.batch_size
        budget = self.sc.max_num_batched_tokens
        prefilling = [r for r in self.running if not r.is_decoding]
        if prefilling:
            cap = self.sc.chunk_cap if self.sc.enable_chunked_prefill else None
            for req in prefilling:
                n = req.num_tokens - req.num_computed_tokens
                if cap is not None:
                    n = min(n, cap, budget)
                elif n > budget:
                    break
                if n <= 0:
                    break
                self._take(out, req, n, decoding=False)
                budget -= n
        else:
            out.num_decode_ready = len(self.running)
            for req in self.running[:budget]:
                self._take(out, req, 1, decoding=True)

    def _take(self, out: SchedulerOutput, req: Request, n: int, decoding: bool) -> None:
        if not self.kv.allocate_slots(req, n):
            raise RuntimeError(f"request {req.request_id} outgrew the KV reserved for its batch")
        out.add(req, n, decoding)


class DynamicBatchScheduler(StaticBatchScheduler):
    def _batch_ready(self, now: float) -> bool:
        if len(self.waiting) >= self.sc.max_num_seqs:
            return True
        # The same sum as next_wakeup_time: `now - oldest >= window` can be false at the
        # very time that wake-up names (float rounding), and the simulator would wake at
        # that instant forever.
        return bool(self.waiting) and now >= self._oldest_arrival() + self.sc.batch_window_s

    def _oldest_arrival(self) -> float:
        return min(r.arrival_time for r in self.waiting)

    def next_wakeup_time(self) -> float | None:
        if self.running or not self.waiting:
            return None
        return self._oldest_arrival() + self.sc.batch_window_s
