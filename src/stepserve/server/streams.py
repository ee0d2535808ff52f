"""What a handler holds of one request: its RequestStream of StreamOutputs, and the three
ways admission can fail (RequestRejected, RequestFailed, EngineUnavailable)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stepserve.request import RejectReason


class RequestRejected(Exception):
    """The scheduler refused the request at admission. `reason`: a RejectReason value
    (queue_full, too_long, empty_prompt), or "invalid" for a request the engine could not
    take at all."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason

    @property
    def queue_full(self) -> bool:
        return self.reason == RejectReason.QUEUE_FULL.value


class RequestFailed(Exception):
    """The engine could not take the request because of a fault of its own (a 500)."""


class EngineUnavailable(Exception):
    """The engine is shutting down, or stopped after a fault."""


@dataclass(slots=True)
class StreamOutput:
    """What one request got in one engine step (or at its end)."""

    text: str  # new text since the previous output (streamed requests only)
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: str | None = None  # stop, length, abort, timed_out, error
    message: str = ""  # why it ended, when it did not end normally
    full_text: str | None = None  # final output only: the whole completion


class RequestStream:
    """The handler's side of one request: `async for out in stream`.

    Outputs the handler has not taken yet are merged into one (texts joined, counts and
    end state from the newer), as vLLM's RequestOutputCollector does: a client that
    falls behind gets bigger chunks instead of a growing backlog of tiny ones, and the
    event loop wakes once per request however many steps it missed."""

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self._pending: StreamOutput | None = None
        self._ready = asyncio.Event()
        self.finished = False  # the handler has taken the final output

    def put(self, out: StreamOutput) -> None:
        """Event loop only."""
        if self._pending is not None:
            out.text = self._pending.text + out.text
        self._pending = out
        self._ready.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamOutput:
        if self.finished:
            raise StopAsyncIteration
        while self._pending is None:
            await self._ready.wait()
            self._ready.clear()
        out, self._pending = self._pending, None
        self._ready.clear()
        if out.finished:
            self.finished = True
        return out
