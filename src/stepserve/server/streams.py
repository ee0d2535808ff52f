"""What a handler holds of one request: its RequestStream of StreamOutputs, and the three
ways admission can fail (RequestRejected, RequestFailed, EngineUnavailable)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stepserve.core.end_reasons import Refusal
from stepserve.core.request import TokenLogprobs


class RequestRejected(Exception):
    """The scheduler refused the request at admission. `reason`: a RejectReason value
    (queue_full, too_long, empty_prompt), or a Refusal value (invalid: a request the
    engine could not take at all); its answer and counter are end_reasons.py's row."""

    def __init__(self, message: str, reason: str = Refusal.INVALID.value) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


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
        await self._wait()
        return self._take(next(iter(self._pending)))

    async def take_ready(self) -> list[StreamOutput]:
        """Every output waiting (at least one; none once finished): a handler that
        renders them together wakes once for all n sequences' news."""
        if self.finished:
            return []
        await self._wait()
        return [self._take(index) for index in list(self._pending)]

    async def _wait(self) -> None:
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
