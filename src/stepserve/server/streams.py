"""What a handler holds of one request: its RequestStream of StreamOutputs (the engine's
outputs.py), and the three
ways admission can fail (RequestRejected, RequestFailed, EngineUnavailable)."""

from __future__ import annotations

import asyncio

from stepserve.core.end_reasons import Refusal
from stepserve.engine.outputs import StreamOutput


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
