"""Requests: what was asked (SamplingParams), where it stands (RequestStatus,
end_reasons.py), when things happened, and its preemption accounting.

One token rule: `num_computed_tokens` chases `num_tokens` (prefill, chunks, recompute
and decode alike).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from stepserve.core import request_limits as limits
from stepserve.core.end_reasons import FinishReason, RejectReason, RequestStatus
from stepserve.core.request_limits import check_range


@dataclass
class SamplingParams:
    """What the client asked for, with vLLM's names, defaults and ranges (bounded in
    request_limits.py), plus scheduling hints (priority, tenant: OpenAI's `user`).
    `max_tokens=None`: what max_model_len leaves; `n > 1`: n children (`child_params`);
    `logprobs`/`prompt_logprobs`: top alternatives per token (0: the token's own)."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0  # lower runs first, as in vLLM
    tenant: str = "default"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop or ())
        self.stop_token_ids = tuple(self.stop_token_ids or ())
        if self.top_k == -1 and not isinstance(self.top_k, bool):
            self.top_k = 0  # vLLM's spelling of "off"
        problems = [p for p in self._range_problems() if p is not None]
        if (isinstance(self.max_tokens, int) and isinstance(self.min_tokens, int)
                and self.min_tokens > self.max_tokens):
            problems.append(f"min_tokens = {self.min_tokens}: must be <= max_tokens = "
                            f"{self.max_tokens}")
        problems += _list_problems("stop", self.stop, str, limits.STOP_MAX_COUNT,
                                   limits.STOP_MAX_CHARS)
        problems += _list_problems("stop_token_ids", self.stop_token_ids, int,
                                   limits.STOP_TOKEN_IDS_MAX_COUNT)
        if not isinstance(self.tenant, str) or len(self.tenant) > limits.TENANT_MAX_CHARS:
            problems.append(f"tenant: must be a string of at most {limits.TENANT_MAX_CHARS} "
                            f"characters")
        if problems:
            raise ValueError("; ".join(problems))

    def _range_problems(self) -> tuple[str | None, ...]:
        optional = (("max_tokens", self.max_tokens, 1, limits.MAX_TOKENS_MAX),
                    ("seed", self.seed, limits.SEED_MIN, limits.SEED_MAX),
                    ("logprobs", self.logprobs, 0, limits.LOGPROBS_MAX),
                    ("prompt_logprobs", self.prompt_logprobs, 0, limits.LOGPROBS_MAX))
        return (
            check_range("temperature", self.temperature, 0.0, limits.TEMPERATURE_MAX),
            check_range("top_k", self.top_k, 0, limits.TOP_K_MAX, integer=True,
                        note=" (0 or -1: off)"),
            check_range("top_p", self.top_p, 0.0, 1.0, low_open=True),
            check_range("min_p", self.min_p, 0.0, 1.0),
            check_range("repetition_penalty", self.repetition_penalty, 0.0,
                        limits.REPETITION_PENALTY_MAX, low_open=True),
            check_range("n", self.n, 1, limits.N_MAX, integer=True),
            check_range("min_tokens", self.min_tokens, 0, limits.MAX_TOKENS_MAX,
                        integer=True),
            check_range("presence_penalty", self.presence_penalty, limits.PENALTY_MIN,
                        limits.PENALTY_MAX),
            check_range("frequency_penalty", self.frequency_penalty, limits.PENALTY_MIN,
                        limits.PENALTY_MAX),
            check_range("priority", self.priority, limits.PRIORITY_MIN, limits.PRIORITY_MAX,
                        integer=True),
            *(None if value is None else check_range(name, value, low, high, integer=True)
              for name, value, low, high in optional),
        )

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index` of an n > 1 request, as vLLM makes it: n = 1, seed + i (wrapped into
    int64), so the samples differ yet the answer is reproducible."""
    seed = params.seed
    if seed is not None:
        seed += index
        if seed > limits.SEED_MAX:
            seed -= 1 << 64
    return replace(params, n=1, seed=seed)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's token, its logprob and rank (1: most likely), and the `top`
    (token id, logprob) pairs asked for."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


def _list_problems(name: str, items: tuple, kind: type, max_count: int,
                   max_chars: int | None = None) -> list[str]:
    if len(items) > max_count:
        return [f"{name}: {len(items)} items, at most {max_count} allowed"]
    for item in items:
        if not isinstance(item, kind) or isinstance(item, bool):
            return [f"{name}: {item!r} is not {'a string' if kind is str else 'an integer'}"]
        if kind is int and not 0 <= item <= limits.INT32_MAX:
            return [f"{name}: {item} is not a token id (an integer >= 0)"]
        if max_chars is not None and len(item) > max_chars:
            return [f"{name}: an item of {len(item)} characters, at most {max_chars} "
                    f"allowed"]
    return []


@dataclass(eq=False)
class Request:
    """One request inside the engine. The scheduler owns its status and counters."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    eos_token_id: int | None = None
    request_class: str = ""  # workload class name, for per-class metrics
    length_estimate: int | None = None  # expected output length (srpt); None: max_tokens
    parent_id: str | None = None  # n > 1: the request this one is child `index` of
    index: int = 0
    cache_salt: str | None = None  # prefix cache namespace (vLLM's): no sharing across salts

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    finish_message: str = ""
    reject_reason: RejectReason | None = None  # set when admission refused it
    # vLLM's stop_reason: the matched stop string or stop id (None otherwise, EOS too)
    stop_reason: str | int | None = None
    # asked-for logprobs: one per output token, one per prompt token after the first
    output_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None

    # timestamps (clock seconds)
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finish_time: float | None = None

    # preemption accounting
    num_preemptions: int = 0
    num_swapped_out_blocks: int = 0
    num_recomputed_tokens: int = 0
    admitted_seq: int = -1  # admission order; FCFS victims are the most recently admitted
    sched_step: int = -1  # scheduler's mark: the step this request was last scheduled in
    sched_tokens: int = 0  # and how many tokens it got in that step
    # prefix cache: tokens it gave at the first admission (usage's cached_tokens), the latest
    num_cached_tokens: int = 0
    prefix_hit_tokens: int = 0
    block_hashes: list = field(default_factory=list, repr=False)  # the KV manager's

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)
        # None until the engine core resolves max_tokens=None against max_model_len
        self.max_tokens = self.sampling_params.max_tokens
        self.min_tokens = self.sampling_params.min_tokens
        self.priority = self.sampling_params.priority
        self.tenant = self.sampling_params.tenant
        self.stop_token_ids = self.sampling_params.stop_token_ids
        # what ends it once min_tokens are out: its stop ids, and EOS unless ignore_eos
        eos = self.eos_token_id is not None and not self.sampling_params.ignore_eos
        self.stop_ids = frozenset(self.stop_token_ids + ((self.eos_token_id,) if eos else ()))
        # EOS ends it with no stop_reason (vLLM checks it first, even if a stop id too)
        self.stop_eos = self.eos_token_id if eos else None
        if self.sampling_params.logprobs is not None:
            self.output_logprobs = []
        if self.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Exactly its newest sampled token is missing (else it is prefilling): the one
        definition, called millions of times a run, hence one len()."""
        n = len(self.output_token_ids)
        return n > 0 and self.num_prompt_tokens + n - self.num_computed_tokens == 1

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def remaining_output_estimate(self) -> int:
        """Output tokens still expected: from the length estimate if given, else max_tokens."""
        expected = self.length_estimate if self.length_estimate is not None else self.max_tokens
        return max(expected - len(self.output_token_ids), 0)

    @property
    def max_total_tokens(self) -> int:
        """Most tokens this request can ever hold in KV: prompt + max_tokens."""
        return self.num_prompt_tokens + self.max_tokens

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


# Request.is_decoding's getter as a plain function, for the hot loops: Python 3.11 does not
# specialise property access (~20-40 ns more per request).
is_decoding: Callable[[Request], bool] = vars(Request)["is_decoding"].fget
