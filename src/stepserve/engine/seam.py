"""The one seam between a front end (the HTTP handlers) and the engine that serves it:
what crosses it, both ways, as typed values, and the interface (`EngineClient`) both
engines implement (server/async_engine.py in this process, cluster/frontend.py over Ray).

    front end -> engine:  add(NewRequest) -> its RequestStream, once admitted
                          (or RequestRejected, RequestFailed, EngineUnavailable)
                          abort(request_id), drain(timeout_s), cut_drain(), stop()
    engine -> front end:  StreamOutputs on the request's RequestStream, exactly one
                          final one per sequence; `fault` once the engine died

A request is checked once, by the engine that takes it (LLMEngine.add_parallel, the
scheduler's admission); a refusal comes back as RequestRejected naming the field.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from stepserve.core.end_reasons import Refusal
from stepserve.core.request import SamplingParams, TokenLogprobs


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request for the engine: the prompt's token ids and how to sample. `streamed`:
    text as it comes (else only the final outputs carry it); no `arrival_time`: now, on
    the engine's clock; `cache_salt`: the prefix cache's namespace."""

    prompt_ids: list[int]
    params: SamplingParams
    streamed: bool = True
    request_id: str | None = None
    arrival_time: float | None = None
    cache_salt: str | None = None


class InvalidRequest(ValueError):
    """The engine cannot take a request as it is (a client's mistake, a 400): `param`
    names the field, `code` the OpenAI error code."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


class RequestRejected(Exception):
    """The scheduler refused the request at admission. `reason`: a RejectReason value
    (queue_full, too_long, empty_prompt), or a Refusal value (invalid: a request the
    engine could not take at all); its answer and counter are end_reasons.py's row."""

    def __init__(self, message: str, reason: str = Refusal.INVALID.value,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.reason = message, reason
        self.param = param  # the field at fault, where the engine knows it
        self.code = code  # the error code, where it is not the reason's own

    @classmethod
    def of(cls, error: InvalidRequest) -> RequestRejected:
        return cls(str(error), Refusal.INVALID.value, error.param, error.code)


class RequestFailed(Exception):
    """The engine could not take the request because of a fault of its own (a 500)."""


class EngineUnavailable(Exception):
    """The engine is shutting down, or stopped after a fault."""


@dataclass(slots=True)
class StreamOutput:
    """What one sequence of a request (choice `index`; n > 1 requests have n) got in one
    engine step (or at its end)."""

    text: str  # new text since the previous output (streamed requests only)
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: str | None = None  # a FinishReason value (end_reasons.py)
    message: str = ""  # why it ended, when it did not end normally
    full_text: str | None = None  # final output only: the whole completion
    index: int = 0
    # asked-for logprobs of the tokens since the previous output (final, unstreamed: all)
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None  # once, in the first output
    num_cached_tokens: int = 0  # prompt tokens the prefix cache gave (usage's cached_tokens)
    # final output only: the stop string or stop token id that ended it (vLLM's
    # stop_reason; None for EOS, length and every other end)
    stop_reason: str | int | None = None

    def merge_into(self, older: StreamOutput) -> None:
        """Make this output also carry `older`'s, which the handler has not taken."""
        self.text = older.text + self.text
        if older.logprobs:
            self.logprobs = older.logprobs + (self.logprobs or [])
        if self.prompt_logprobs is None:
            self.prompt_logprobs = older.prompt_logprobs


class RequestStream:
    """The handler's side of one request: `async for out in stream`, outputs of its `n`
    sequences interleaved (each tagged with its index); done once all n have ended.

    Outputs the handler has not taken yet are merged, per sequence, into one (texts
    joined, counts and end state from the newer), as vLLM's RequestOutputCollector does:
    a client that falls behind gets bigger chunks instead of a growing backlog of tiny
    ones, and the event loop wakes once per request however many steps it missed."""

    def __init__(self, request_id: str, num_prompt_tokens: int, n: int = 1) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.n = n
        self._pending: dict[int, StreamOutput] = {}
        self._ready = asyncio.Event()
        self._ended = 0  # sequences whose final output the handler has taken
        self._finals_put = 0
        self.finished = False  # the handler has taken every final output

    def put(self, out: StreamOutput) -> None:
        """Event loop only."""
        if out.finished:
            self._finals_put += 1
        older = self._pending.pop(out.index, None)
        if older is not None:
            out.merge_into(older)
        self._pending[out.index] = out
        self._ready.set()

    @property
    def all_put(self) -> bool:
        """Every sequence's final output has been put (the engine is done with it)."""
        return self._finals_put >= self.n

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamOutput:
        if self.finished:
            raise StopAsyncIteration
        await self.wait_ready()
        return self._take(next(iter(self._pending)))

    @property
    def request_ids(self) -> tuple[str, ...]:
        """The engine requests this stream answers (one; a list prompt's have several)."""
        return (self.request_id,)

    async def take_ready(self) -> list[StreamOutput]:
        """Every output waiting (at least one; none once finished): a handler that
        renders them together wakes once for all n sequences' news."""
        if self.finished:
            return []
        await self.wait_ready()
        return self.take_now()

    @property
    def has_ready(self) -> bool:
        return bool(self._pending)

    def take_now(self) -> list[StreamOutput]:
        """Every output waiting, without waiting (maybe none)."""
        return [self._take(index) for index in list(self._pending)]

    async def wait_ready(self) -> None:
        while not self._pending:
            await self._ready.wait()
            self._ready.clear()

    def _take(self, index: int) -> StreamOutput:
        out = self._pending.pop(index)
        if not self._pending:
            self._ready.clear()
        if out.finished:
            self._ended += 1
            self.finished = self._ended >= self.n
        return out


class EngineClient(Protocol):
    """What the handlers and the server's lifecycle use of an engine."""

    accepting: bool  # False once a drain began
    fault: str | None  # why the engine died (None while it runs)

    @property
    def is_running(self) -> bool: ...

    @property
    def num_live(self) -> int: ...  # requests admitted and not yet ended

    async def add(self, request: NewRequest) -> RequestStream: ...

    def abort(self, request_id: str, message: str = "aborted by the client") -> None: ...

    async def drain(self, timeout_s: float) -> tuple[int, int]: ...

    def cut_drain(self) -> None: ...

    async def stop(self) -> None: ...
