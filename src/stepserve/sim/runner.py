"""SimRunner: stands in for the model. It "samples" a token for every sequence that
reached its end and says how long the step took, from a cost model. A request stops
by emitting EOS when it reaches its true output length from the workload, so the
scheduler sees exactly what it would see from a real model."""

from __future__ import annotations

from operator import attrgetter, sub

from stepserve.core.decode_run import Sampler
from stepserve.core.output import RunnerOutput, SchedulerOutput
from stepserve.sim.cost import CostModel

SIM_EOS = 0
SIM_TOKEN = 1
_ID = attrgetter("request_id")


class SimRunner:
    reads_block_tables = False  # a cost model prices counts, never block ids

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        # request id -> how many output tokens it holds when it samples EOS (its workload
        # output length - 1)
        self.eos_after: dict[str, int] = {}
        eos_after = self.eos_after
        # A decode run's view of the same rule: the steps in which each request samples
        # SIM_TOKEN before its first EOS.
        self.sampler = Sampler(SIM_TOKEN, SIM_EOS, lambda batch, held: list(
            map(sub, map(eos_after.__getitem__, map(_ID, batch)), held)))
        self.decode_step_time = cost_model.decode_step_time

    def register(self, request_id: str, output_len: int) -> None:
        self.eos_after[request_id] = output_len - 1

    def release(self, request_ids: list[str]) -> None:
        """Forget requests that ended (what `execute` does with finished_request_ids)."""
        for rid in request_ids:
            self.eos_after.pop(rid, None)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        eos_after = self.eos_after
        self.release(out.finished_request_ids)
        # A chunk that does not reach the end of the sequence samples nothing (None); a
        # sequence at its workload length samples EOS. (One expression per request: the
        # simulator runs this for every request in every step.)
        sampled: list[int | None] = [
            None if req.num_computed_tokens + n < req.num_prompt_tokens + (
                num_output := len(req.output_token_ids))
            else SIM_EOS if num_output >= eos_after[req.request_id]
            else SIM_TOKEN
            for req, n in zip(out.requests, out.num_scheduled_tokens)]
        return RunnerOutput(sampled, self.cost_model.step_time(out))
