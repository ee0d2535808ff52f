"""What the engine hands back. Offline, in vLLM's shape: RequestOutput.outputs[i].text,
and, when asked, logprobs as vLLM gives them: per position a dict {token id: Logprob}
holding the token there and the top alternatives (prompt logprobs start with None: the
first prompt token has no context to be predicted from). (Step by step, a server gets
seam.py's StreamOutputs; output_processor.py makes both.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stepserve.core.request import Request, TokenLogprobs
from stepserve.engine.seam import StreamOutput


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # stop, length, abort, rejected, timed_out
    stop_reason: str | int | None = None  # the stop string or token that ended it
    cumulative_logprob: float | None = None  # with logprobs: the sum of the tokens'
    logprobs: list[PositionLogprobs] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int

    @classmethod
    def of(cls, r: Request) -> RequestMetrics:
        return cls(r.arrival_time, r.first_scheduled_time,
                   r.token_times[0] if r.token_times else None, r.finish_time,
                   r.num_preemptions)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
    message: str = ""  # why it ended, when it did not end normally
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    # prompt tokens served from the prefix cache at admission (vLLM's field; whole
    # blocks); n > 1: the fewest any sequence got, as the server's usage counts them
    num_cached_tokens: int = 0

    @classmethod
    def of(cls, group: Sequence[Request], finals: Sequence[StreamOutput], prompt: str | None,
           decode: Callable[[int], str]) -> RequestOutput:
        """One request's output from its sequences (the children of an n > 1 request, in
        index order) and their final outputs (the same order)."""
        first = group[0]
        prompt_lp = logprobs_list(first.prompt_logprobs, decode)
        if prompt_lp is not None:
            prompt_lp = [None, *prompt_lp]
        completions = []
        for req, final in zip(group, finals, strict=True):
            found = req.output_logprobs
            completions.append(CompletionOutput(
                req.index, final.full_text or "", list(req.output_token_ids),
                final.finish_reason, req.stop_reason,
                None if found is None else sum(lp.logprob for lp in found),
                logprobs_list(found, decode)))
        messages = (f.message for f in finals if f.message)
        return cls(first.parent_id or first.request_id, prompt, first.prompt_token_ids,
                   completions, all(r.is_finished for r in group), RequestMetrics.of(first),
                   "; ".join(dict.fromkeys(messages)), prompt_lp,
                   min(r.num_cached_tokens for r in group))


def logprobs_list(found: Sequence[TokenLogprobs] | None,
                  decode: Callable[[int], str]) -> list[PositionLogprobs] | None:
    """Each position as vLLM's dict: the token itself first, then the top ones."""
    if found is None:
        return None
    out = []
    for lp in found:
        position = {lp.token_id: Logprob(lp.logprob, lp.rank, decode(lp.token_id))}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            position.setdefault(tid, Logprob(value, rank, decode(tid)))
        out.append(position)
    return out
