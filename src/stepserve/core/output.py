"""What crosses the seam between the scheduler and a runner, and what a step leaves for
the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepserve.core.request import Request, TokenLogprobs


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch: `requests[i]` computes `num_scheduled_tokens[i]` tokens from its
    `num_computed_tokens`, sampling iff that reaches `num_tokens`. Block copies run before
    the forward pass, swap_out first (its freed blocks may be a swap_in's targets)."""

    step_index: int
    requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # per request: its device blocks (the KV manager's own list: read, never changed)
    block_tables: list[list[int]] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block)
    preempted: list[Request] = field(default_factory=list)
    # requests that ended since the previous step (a runner drops what it kept of them)
    finished_request_ids: list[str] = field(default_factory=list)
    num_decode_ready: int = 0  # running requests that wanted a decode token this step
    slots_held: int = 0  # batch slots occupied or reserved (for slot utilisation)

    def add(self, request: Request, num_tokens: int, decoding: bool) -> None:
        """Batch `request` for `num_tokens` tokens; its blocks must already cover them."""
        request.sched_step = self.step_index
        request.sched_tokens = num_tokens
        self.requests.append(request)
        self.num_scheduled_tokens.append(num_tokens)
        if decoding:
            self.num_decode_tokens += 1
        else:
            self.num_prefill_tokens += num_tokens

    def remove(self, request: Request, decoding: bool) -> int:
        """Take a preemption victim out of the batch; returns the tokens it had."""
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
    """What the runner did: a sampled token per request (None where the chunk did not
    reach the end), the step's time, and where asked the sampled token's logprobs and
    those of the prompt positions the chunk predicted."""

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

    @property
    def kind(self) -> str:
        """"prefill_only", "decode_only", "mixed" or "empty": the one classification."""
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
    """What one engine core step did, the one thing every driver reads: the step's
    `record` (None: nothing ran), the requests `emitted` a token (batch order; each one's
    new token is its last), and those `finished` since the previous result, in order
    (not those refused at admission: `add_request` said so)."""

    record: StepRecord | None
    emitted: list[Request]
    finished: list[Request]

    @property
    def ran(self) -> bool:
        return self.record is not None
