"""One step's ragged batch, flattened: what the runner feeds the model for a
SchedulerOutput. Sequences go decode first (paged_attention.decode_first_order); each
contributes the tokens it computes this step, its block table, and, where its chunk
reaches the end of the sequence, a row to sample; rows that score prompt tokens (prompt
logprobs) are listed apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request
from stepserve.model.paged_attention import decode_first_order


def new_tokens(request: Request, start: int, n: int) -> list[int]:
    """`request.all_token_ids[start:start + n]` without concatenating the whole list
    (a decode step needs one token, not a copy of a 4k-token history)."""
    prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
    if start >= num_prompt:
        return request.output_token_ids[start - num_prompt:start - num_prompt + n]
    if start + n <= num_prompt:
        return prompt[start:start + n]
    return prompt[start:] + request.output_token_ids[:start + n - num_prompt]


@dataclass(slots=True)
class StepBatch:
    """One step's flattened ragged batch, in decode-first order."""

    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)  # flat row of each sampling seq
    sample_of: list[int] = field(default_factory=list)  # and its index in the step
    # (index in the step, flat row, the prompt token that row predicts)
    prompt_rows: list[tuple[int, int, int]] = field(default_factory=list)
    num_decoding: int = 0


def build_step_batch(sched_out: SchedulerOutput, scheduled: list[int]) -> StepBatch:
    requests, counts = sched_out.requests, sched_out.num_scheduled_tokens
    ends = [requests[i].num_computed_tokens + counts[i] for i in scheduled]
    decoding = [requests[i].is_decoding for i in scheduled]
    b = StepBatch(num_decoding=sum(decoding))
    for i in (scheduled[j] for j in decode_first_order(decoding, ends)):
        req, n = requests[i], counts[i]
        start = req.num_computed_tokens
        if start + n > req.num_tokens:
            raise ValueError(f"request {req.request_id}: {n} tokens scheduled at "
                             f"{start} but it has only {req.num_tokens}")
        base = len(b.input_ids)
        b.starts.append(start)
        b.lens.append(n)
        b.tables.append(sched_out.block_tables[i])
        b.input_ids += new_tokens(req, start, n)
        if req.prompt_logprobs is not None:
            # position p predicts prompt token p + 1; positions already scored (before a
            # recompute, say) are not scored again
            prompt = req.prompt_token_ids
            first = max(start, len(req.prompt_logprobs))
            b.prompt_rows += [(i, base + p - start, prompt[p + 1])
                              for p in range(first, min(start + n, len(prompt) - 1))]
        if start + n == req.num_tokens:
            b.sample_rows.append(len(b.input_ids) - 1)
            b.sample_of.append(i)
    return b
