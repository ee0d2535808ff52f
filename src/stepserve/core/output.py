"""What crosses the seam between the scheduler and a runner, and what one step leaves
behind for the metrics. Plain dataclasses; no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepserve.core.request import Request, TokenLogprobs


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch.

    `requests[i]` computes `num_scheduled_tokens[i]` tokens starting at its current
    `num_computed_tokens`; it samples a token iff that reaches `num_tokens`. The block
    copies must be done before the forward pass: swap_out (device -> CPU) first, since
    the freed device blocks may already be handed to a swap_in (CPU -> device).
    """

    step_index: int
    requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # per scheduled request: its device blocks, covering what this step computes (the KV
    # manager's own list: runners read it, never change it); filled once the batch is
    # formed (SchedulerBase.schedule)
    block_tables: list[list[int]] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block)
    preempted: list[Request] = field(default_factory=list)
    # requests that ended since the previous step (a runner drops what it kept of them)
    finished_request_ids: list[str] = field(default_factory=list)
    num_decode_ready: int = 0  # running requests that wanted a decode token this step
    slots_held: int = 0  # batch slots occupied or reserved (for slot utilisation)

    def add(self, request: Request, num_tokens: int, decoding: bool) -> None:
        """Put `request` in this step's batch to compute `num_tokens` tokens (1 when it is
        decoding); its blocks must already cover them."""
        request.sched_step = self.step_index
        request.sched_tokens = num_tokens
        self.requests.append(request)
        self.num_scheduled_tokens.append(num_tokens)
        if decoding:
            self.num_decode_tokens += 1
        else:
            self.num_prefill_tokens += num_tokens

    def remove(self, request: Request, decoding: bool) -> int:
        """Take `request` back out of the batch (it became a preemption victim); returns
        the tokens it had been given."""
        k = self.requests.index(request)
        given = self.num_scheduled_tokens[k]
        if decoding:
            self.num_decode_tokens -= given
        else:
            self.num_prefill_tokens -= given
        del self.requests[k], self.num_scheduled_tokens[k]
        request.sched_step = -1
        return given

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.requests and not self.swap_out and not self.swap_in


@dataclass(slots=True)
class RunnerOutput:
    """What the runner did: a sampled token per scheduled request (None where the chunk
    did not reach the end of the sequence), and how long the step took.

    Only for requests whose params ask (else None, and None throughout for a runner that
    computes none, like the simulator's): `logprobs[i]`, those of request i's sampled
    token; `prompt_logprobs[i]`, those of the prompt tokens this step's chunk predicted
    (positions after the ones the request already holds)."""

    sampled_token_ids: list[int | None]
    elapsed_s: float
    logprobs: list[TokenLogprobs | None] | None = None
    prompt_logprobs: list[list[TokenLogprobs] | None] | None = None


@dataclass(slots=True)
class StepRecord:
    """One executed step, as the metrics see it."""

    index: int
    start_s: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_scheduled_seqs: int
    num_decode_ready: int
    num_running: int
    num_waiting: int
    num_swapped: int
    num_preempted: int
    kv_usage: float
    slots_held: int
    num_active: int  # sequences that produced an output token this step

    # The one classification of a step, read by the live metrics and the summaries alike.
    @property
    def kind(self) -> str:
        """"prefill_only", "decode_only", "mixed" or "empty" (no token computed)."""
        prefill, decode = self.num_prefill_tokens > 0, self.num_decode_tokens > 0
        if prefill and decode:
            return "mixed"
        return "prefill_only" if prefill else "decode_only" if decode else "empty"

    @property
    def is_prefill_only(self) -> bool:
        return self.num_prefill_tokens > 0 and self.num_decode_tokens == 0

    @property
    def is_zero_decode(self) -> bool:
        """Sequences were ready to decode and none did: the step starved decode."""
        return self.num_decode_ready > 0 and self.num_decode_tokens == 0


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one call of the engine core's step did: the one thing every driver reads.

    `record` is the step that ran (None when nothing could run: the batch was empty or the
    runner failed). `emitted` are the requests that got a token in it, in batch order,
    some of them now finished (each one's new token is its last output token).
    `finished` are the requests that ended since the previous result, for any reason
    (stop, length, abort, timed out, error), in the order they ended; a request refused at
    admission is not among them: `add_request` said so when it was added."""

    record: StepRecord | None
    emitted: list[Request]
    finished: list[Request]

    @property
    def ran(self) -> bool:
        return self.record is not None
