"""Budget order: which of the scheduler's named steps get a step's token budget first.
Each order is a small class chosen by name (`budget_order` in SchedulerConfig).

The steps (Scheduler methods; each takes the budget left and returns what it leaves):
  schedule_running           running requests in admission order: decodes 1 token,
                             prefills their next chunk
  schedule_running_prefills  the same pass, prefills only
  schedule_running_decodes   the same pass, decodes only
  schedule_swapped           swapped requests back onto the device
  schedule_waiting           new (and recompute-preempted) prompts
"""

from __future__ import annotations

from typing import Protocol

from stepserve.config.settings import SchedulerConfig
from stepserve.core.output import SchedulerOutput


class SchedulingSteps(Protocol):
    """The named steps a budget order puts in order (implemented by Scheduler)."""

    def schedule_running(self, out: SchedulerOutput, budget: int, now: float) -> int: ...

    def schedule_running_prefills(self, out: SchedulerOutput, budget: int,
                                  now: float) -> int: ...

    def schedule_running_decodes(self, out: SchedulerOutput, budget: int,
                                 now: float) -> int: ...

    def schedule_swapped(self, out: SchedulerOutput, budget: int, now: float) -> int: ...

    def schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> int: ...


class BudgetOrder:
    """Interface: `fill` runs the steps in this order's sequence, passing the budget on."""

    name = ""
    # With nothing waiting or swapped and every running request decoding, a step gives
    # each decode one token while the budget lasts (what core/decode_run.py relies on).
    plain_decode_steps = False

    def __init__(self, sc: SchedulerConfig) -> None:
        self.max_num_batched_tokens = sc.max_num_batched_tokens

    def fill(self, steps: SchedulingSteps, out: SchedulerOutput, now: float) -> None:
        raise NotImplementedError


class DecodeFirst(BudgetOrder):
    """Running sequences (decodes and unfinished prefills alike, in admission order) before
    swapped ones, before new prompts: a running sequence never waits behind a new one."""

    name = "decode_first"
    plain_decode_steps = True

    def fill(self, steps: SchedulingSteps, out: SchedulerOutput, now: float) -> None:
        budget = steps.schedule_running(out, self.max_num_batched_tokens, now)
        budget = steps.schedule_swapped(out, budget, now)
        steps.schedule_waiting(out, budget, now)


class PrefillFirst(BudgetOrder):
    """Legacy: prompts first (running chunks, then new prompts), decode gets what is left
    under the rule "decode 预算 = 总预算 - 本步 prefill chunk", then swapped ones."""

    name = "prefill_first"
    plain_decode_steps = True

    def __init__(self, sc: SchedulerConfig) -> None:
        super().__init__(sc)
        self.chunk_cap = sc.chunk_cap

    def fill(self, steps: SchedulingSteps, out: SchedulerOutput, now: float) -> None:
        budget = steps.schedule_running_prefills(out, self.max_num_batched_tokens, now)
        budget = steps.schedule_waiting(out, budget, now)
        budget = self.decode_budget(budget, out.num_prefill_tokens)
        budget = steps.schedule_running_decodes(out, budget, now)
        steps.schedule_swapped(out, budget, now)

    def decode_budget(self, budget: int, num_prefill_tokens: int) -> int:
        """A step that prefills reserves a whole chunk for it, so decode budget = budget -
        chunk cap. A cap equal to the budget leaves decode nothing until no prompt is left
        (the mixed-pool incident)."""
        if not num_prefill_tokens:
            return budget
        return min(budget, self.max_num_batched_tokens
                   - max(num_prefill_tokens, self.chunk_cap))


BUDGET_ORDERS: dict[str, type[BudgetOrder]] = {
    order.name: order for order in (DecodeFirst, PrefillFirst)}


def make_budget_order(name: str, sc: SchedulerConfig) -> BudgetOrder:
    """The budget order called `name`, with the budget and chunk cap of `sc`."""
    order = BUDGET_ORDERS.get(name)
    if order is None:
        raise ValueError(f"budget_order = {name!r}: must be one of {', '.join(BUDGET_ORDERS)}")
    return order(sc)
