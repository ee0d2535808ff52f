"""`RequestSpec`: one request of a workload, engine-neutral: the simulator turns it into a
`Request` with `prompt_len` dummy tokens, the bench client into an HTTP call. `output_len`
is the truth the simulated model obeys (it generates that many tokens, then stops);
`max_tokens` is only what the client asked for, which is all a real scheduler would see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepserve.config.limits import MAX_LEN
from stepserve.core.request_limits import PRIORITY_MAX, PRIORITY_MIN, TENANT_MAX_CHARS
from stepserve.workload.errors import WorkloadError, check_int, check_positive, check_str
from stepserve.workload.sessions import MAX_THINK_S, MAX_TURNS


def check_priority_and_tenant(priority: Any, tenant: Any) -> None:
    """What a request's SamplingParams will accept (request_limits.py), checked here so
    a workload fails when it is read, not mid-run."""
    check_int("priority", priority, lo=PRIORITY_MIN, hi=PRIORITY_MAX)
    name = check_str("tenant", tenant)
    if len(name) > TENANT_MAX_CHARS:
        raise WorkloadError(f"tenant = {name[:40]!r}...: {len(name)} characters; at most "
                            f"{TENANT_MAX_CHARS}")


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. Invariant: 1 <= output_len <= max_tokens."""

    index: int
    arrival_s: float
    prompt_len: int
    output_len: int
    max_tokens: int
    priority: int = 0  # lower is more urgent, as in vLLM
    tenant: str = "default"
    request_class: str = "default"
    length_estimate: int | None = None
    prefix: str | None = None  # the shared prefix its prompt starts with (shared_prefix.py)
    prefix_len: int = 0  # that prefix's tokens, counted in prompt_len
    # a multi-turn session (sessions.py): its first turn's index, this turn's place in it,
    # the seconds after the previous turn's end it is sent, and the tokens of its prompt
    # that are the conversation so far (the previous prompt and its answer)
    session: int | None = None
    turn: int = 0
    think_time_s: float = 0.0
    history_len: int = 0

    def __post_init__(self) -> None:
        check_int("index", self.index, lo=0)
        object.__setattr__(self, "arrival_s",
                           check_positive("arrival_s", self.arrival_s, allow_zero=True))
        check_int("prompt_len", self.prompt_len, lo=1, hi=MAX_LEN)
        check_int("output_len", self.output_len, lo=1, hi=MAX_LEN)
        check_int("max_tokens", self.max_tokens, lo=1, hi=MAX_LEN)
        if self.output_len > self.max_tokens:
            raise WorkloadError(f"output_len = {self.output_len}: must be <= max_tokens = "
                                f"{self.max_tokens} (a request cannot outrun its cap)")
        check_priority_and_tenant(self.priority, self.tenant)
        check_str("class", self.request_class)
        if self.length_estimate is not None:
            check_int("length_estimate", self.length_estimate, lo=1, hi=MAX_LEN)
        if self.prefix is not None or self.prefix_len:
            check_str("prefix", self.prefix)
            check_int("prefix_len", self.prefix_len, lo=1, hi=self.prompt_len)
        if self.session is not None or self.turn:
            check_int("session", self.session, lo=0, hi=self.index)
            check_int("turn", self.turn, lo=0, hi=MAX_TURNS - 1)
            check_positive("think_time_s", self.think_time_s, allow_zero=True, hi=MAX_THINK_S)
            check_int("history_len", self.history_len, lo=0, hi=self.prompt_len - 1)
