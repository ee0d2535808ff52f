"""SimRunner: stands in for the model. It "samples" a token for every sequence that
reached its end and says how long the step took, from a cost model. A request stops
by emitting EOS when it reaches its true output length from the workload, so the
scheduler sees exactly what it would see from a real model."""

from __future__ import annotations

from stepserve.core.output import RunnerOutput, SchedulerOutput
from stepserve.sim.cost import CostModel

SIM_EOS = 0
SIM_TOKEN = 1


class SimRunner:
    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.target_len: dict[str, int] = {}  # request id -> output length before EOS

    def register(self, request_id: str, output_len: int) -> None:
        self.target_len[request_id] = output_len

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        target = self.target_len
        for rid in out.finished_request_ids:
            target.pop(rid, None)
        sampled: list[int | None] = []
        append = sampled.append
        for req, n in zip(out.requests, out.num_scheduled_tokens):
            if req.num_computed_tokens + n < req.num_prompt_tokens + len(req.output_token_ids):
                append(None)  # a prefill chunk that does not reach the end samples nothing
            elif len(req.output_token_ids) + 1 >= target[req.request_id]:
                append(SIM_EOS)
            else:
                append(SIM_TOKEN)
        return RunnerOutput(sampled, self.cost_model.step_time(out))
