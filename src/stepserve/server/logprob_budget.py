"""The bound on how many logprob entries one request may ask for, checked before it runs.

An entry is a token's own logprob or one of its top alternatives; a request's entries are
n x (tokens whose logprobs it returns) x (alternatives + 1). Each factor is bounded alone,
not their product: n = 128 over a 4,000-token echo with 20 alternatives is 10.8 million
entries, minutes of work and gigabytes for one request. DEFAULT_MAX_LOGPROB_ENTRIES
(250,000) fits every single-sequence use at the default context (4,096 positions x 21 =
86,016), and renders as a ~17 MB chat body in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.server.errors import bad_request
from stepserve.server.protocol import ChatCompletionRequest, CompletionRequest

DEFAULT_MAX_LOGPROB_ENTRIES = 250_000


@dataclass(frozen=True)
class LogprobAsk:
    """What one request asks for: `n` sequences, per sequence the tokens whose logprobs
    it returns (each part named for the message), `top` alternatives per token."""

    n: int
    parts: tuple[tuple[str, int], ...]  # (what, tokens)
    top: int
    param: str  # the field a refusal names
    n_param: str = "n"  # the field n comes from (best_of, when it runs more)

    @property
    def tokens(self) -> int:
        return sum(count for _, count in self.parts)

    @property
    def entries(self) -> int:
        return self.n * self.tokens * (self.top + 1)


def completion_ask(body: CompletionRequest, n: int, max_tokens: int, only_prompt: bool,
                   num_prompt_tokens: int) -> LogprobAsk:
    """`n`: the sequences run (best_of when larger); `only_prompt`: echo with
    max_tokens = 0 (the generated token is not shown)."""
    parts: list[tuple[str, int]] = []
    if body.logprobs is not None and not only_prompt:
        parts.append(_max_tokens_part("max_tokens", body.max_tokens, max_tokens))
    if body.logprobs is not None and body.echo:
        parts.append(("the prompt, echoed", num_prompt_tokens))
    if body.prompt_logprobs is not None:
        parts.append(("the prompt, for prompt_logprobs", num_prompt_tokens))
    top = max(body.logprobs or 0, body.prompt_logprobs or 0)
    param = "logprobs" if body.logprobs is not None else "prompt_logprobs"
    return LogprobAsk(n, tuple(parts), top, param, "n" if n == body.n else "best_of")


def chat_ask(body: ChatCompletionRequest, param: str, max_tokens: int,
             num_prompt_tokens: int) -> LogprobAsk:
    """`param`: the field that set max_tokens (max_completion_tokens or max_tokens)."""
    parts: list[tuple[str, int]] = []
    given = body.max_completion_tokens or body.max_tokens
    if body.logprobs:
        parts.append(_max_tokens_part(param, given, max_tokens))
    if body.prompt_logprobs is not None:
        parts.append(("the prompt, for prompt_logprobs", num_prompt_tokens))
    top = max((body.top_logprobs or 0) if body.logprobs else 0, body.prompt_logprobs or 0)
    param = ("top_logprobs" if body.top_logprobs else "logprobs") if body.logprobs \
        else "prompt_logprobs"
    return LogprobAsk(body.n, tuple(parts), top, param)


def _max_tokens_part(param: str, given: int | None, max_tokens: int) -> tuple[str, int]:
    return (param if given is not None else f"{param} (its default)", max_tokens)


def check_logprob_budget(ask: LogprobAsk,
                         max_entries: int = DEFAULT_MAX_LOGPROB_ENTRIES) -> None:
    """A 400 stating the product and its factors when `ask` is over `max_entries`."""
    if ask.entries <= max_entries:
        return
    parts = " + ".join(f"{what} {count:,}" for what, count in ask.parts)
    raise bad_request(
        f"the request asks for {ask.entries:,} logprob entries: {ask.n_param} {ask.n} x "
        f"{ask.tokens:,} tokens ({parts}) x {ask.top + 1} per token ({ask.top} top "
        f"logprobs + the token itself); at most {max_entries:,} are allowed per request. "
        f"Lower {ask.n_param}, the tokens (max_tokens, the prompt) or the number of top "
        f"logprobs", ask.param,
        "too_many_logprobs")
