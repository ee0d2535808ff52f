"""Answering one admitted request: its n sequences' final outputs as one JSON body, or
server-sent events as they come; a request that ended abnormally becomes an error (a
proper status while no header is sent, an SSE error event after).

Outcomes map to statuses before any header is sent whenever possible: the handler waits
for a request's first output before it starts a stream, so a queue timeout is still a
clean 503. Failures after the stream began are an SSE error event, then `[DONE]`. A
failure of one of n sequences ends the whole request (its siblings are aborted).

An answer that can be big (logprobs, echo, n > 1) is rendered on a worker thread, never
on the event loop: its JSON body, and each batch of its server-sent events. Its size is
bounded before it runs (logprob_budget.py); rendering it still takes a while, and on the
loop that while would hold up every other stream's tokens. A plain stream's token chunks
stay on the loop: one json.dumps each, cheaper than a hand-off.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from stepserve.core import request_limits as lim
from stepserve.core.end_reasons import end_of
from stepserve.engine.seam import RequestStream, StreamOutput
from stepserve.server.errors import SERVER_ERROR, APIError
from stepserve.server.logprobs import LogprobRenderer, output_entries, prompt_entries
from stepserve.server.prompts import ServingContext
from stepserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _Sampling,
)
from stepserve.server.render_pace import render_thread
from stepserve.server.responses import (
    ChatChoice,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionResponse,
    RawBlocks,
    UsageInfo,
    prompt_cached_tokens,
)
from stepserve.server.sse import SSE_DONE, Chunks, Echo

log = logging.getLogger("stepserve.server")

# Big answers are rendered here. Two threads: one long render does not hold up the next
# answer's, yet a burst of them queues instead of piling threads onto the interpreter
# lock that the event loop and the engine thread need too.
_RENDER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stepserve-render",
                             initializer=render_thread)

R = TypeVar("R")


def ended_error(out: StreamOutput) -> APIError | None:
    """The error for a request that ended abnormally (None: it completed)."""
    end = end_of(out.finish_reason)
    return None if end.completed else APIError.of(end, out.message)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def next_output(ctx: ServingContext, request: Request,
                      stream: RequestStream) -> StreamOutput | None:
    """The stream's next output, or None if the client went away first (the request is
    aborted then)."""
    get = asyncio.ensure_future(stream.__anext__())
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait((get, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not get.done():
            get.cancel()
            ctx.engine.abort(stream.request_id)
    return get.result() if get.done() and not get.cancelled() else None


def response_id(request: Request, body: _Sampling, prefix: str) -> str:
    """`{prefix}-{id}`: the X-Request-Id header, else the body's request_id (vLLM), else
    a random one."""
    given = request.headers.get("x-request-id") or body.request_id
    if given and len(given) <= lim.REQUEST_ID_MAX_CHARS:
        return f"{prefix}-{given}"
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Answer:
    """How one request is answered: one JSON body of its n choices, or server-sent
    events."""

    def __init__(self, ctx: ServingContext, body: CompletionRequest | ChatCompletionRequest,
                 prefix: str, renderer: LogprobRenderer | None = None,
                 echo: Echo | None = None) -> None:
        self.ctx, self.body, self.prefix = ctx, body, prefix
        self.renderer, self.echo = renderer, echo
        self.raw = RawBlocks()  # the rendered logprob blocks of the JSON body
        self.created = int(time.time())
        self.big = renderer is not None or echo is not None or body.n > 1 \
            or getattr(body, "best_of", None) is not None

    async def render(self, fn: Callable[..., R], *args) -> R:
        """`fn(*args)`: on a render thread when the answer can be big, else here."""
        if not self.big:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(_RENDER, fn, *args)

    async def send(self, request: Request, stream: RequestStream, chunks: type[Chunks],
                   response: Callable[[str, list[StreamOutput]], BaseModel]) -> Response:
        ctx = self.ctx
        rid = response_id(request, self.body, self.prefix)
        try:
            if self.body.stream:
                return await self._start_stream(request, stream, chunks(
                    rid, self.created, ctx.model_name, self.body, self.renderer, self.echo))
            outs = await _finals(ctx, request, stream)
            if outs is None:
                return Response(status_code=499)  # nobody is listening
            body = await self.render(lambda: self.raw.dump(response(rid, outs)).encode())
            return Response(body, media_type="application/json")
        except BaseException:
            # A fault (or cancellation) in this handler: the request must not run on
            # unread. The error itself becomes a 500 in OpenAI's shape (api.py's handler).
            if not stream.finished:
                ctx.engine.abort(stream.request_id, "the request's handler failed")
            raise

    def _usage(self, outs: list[StreamOutput]) -> UsageInfo:
        made = sum(o.num_output_tokens for o in outs)
        if self.echo is not None and self.echo.only_prompt:
            made = 0
        return UsageInfo.of(outs[0].num_prompt_tokens, made,
                            prompt_cached_tokens(o.num_cached_tokens for o in outs))

    def completion(self, rid: str, outs: list[StreamOutput]) -> CompletionResponse:
        usage = self._usage(outs)  # best_of: every sequence run counts
        if len(outs) > self.body.n:  # best_of: the n with the highest total logprob
            outs = sorted(outs, key=lambda o: -sum(lp.logprob for lp in o.logprobs or ()))
            outs = outs[:self.body.n]
            for k, o in enumerate(outs):
                o.index = k
        return CompletionResponse(id=rid, created=self.created, model=self.ctx.model_name,
                                  choices=[self._completion_choice(o) for o in outs],
                                  usage=usage)

    def _completion_choice(self, out: StreamOutput) -> CompletionChoice:
        echo, body, renderer = self.echo, self.body, self.renderer
        only_prompt = echo is not None and echo.only_prompt
        text = "" if only_prompt else out.full_text or ""
        entries = [] if only_prompt else output_entries(out.logprobs)
        if echo is not None:
            text = echo.text + text
            entries = prompt_entries(echo.prompt_ids, out.prompt_logprobs) + entries
        choice = CompletionChoice(index=out.index, text=text, finish_reason=out.finish_reason,
                                  stop_reason=out.stop_reason)
        if renderer is not None and body.logprobs is not None:  # type: ignore[union-attr]
            choice.logprobs = self.raw.put(renderer.completion(entries, 0)[0])
        if renderer is not None and body.prompt_logprobs is not None:
            choice.prompt_logprobs = self.raw.put(renderer.vllm_prompt(out.prompt_logprobs
                                                                       or []))
        return choice

    def chat(self, rid: str, outs: list[StreamOutput]) -> ChatCompletionResponse:
        renderer, body = self.renderer, self.body
        answer = ChatCompletionResponse(
            id=rid, created=self.created, model=self.ctx.model_name, usage=self._usage(outs),
            choices=[ChatChoice(index=o.index,
                                message=ChatResponseMessage(content=o.full_text or ""),
                                finish_reason=o.finish_reason, stop_reason=o.stop_reason,
                                logprobs=self.raw.put(renderer.chat(o.logprobs or []))
                                if renderer is not None and body.logprobs else None)
                     for o in outs])
        if renderer is not None and body.prompt_logprobs is not None and outs:
            answer.prompt_logprobs = self.raw.put(
                renderer.vllm_prompt(outs[0].prompt_logprobs or []))
        return answer

    # ---- streaming ----

    async def _start_stream(self, request: Request, stream: RequestStream,
                            chunks: Chunks) -> Response:
        first = await next_output(self.ctx, request, stream)
        if first is None:
            return Response(status_code=499)
        if first.finished and (err := ended_error(first)) is not None:
            raise err  # still before any header: a proper status
        return StreamingResponse(self._events(stream, first, chunks),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _events(self, stream: RequestStream, first: StreamOutput,
                      chunks: Chunks) -> AsyncIterator[bytes | str]:
        outs, opening = [first], True
        try:
            while True:
                events, ended = await self.render(_render_events, chunks, outs, opening,
                                                  stream.finished)
                opening = False
                if events:
                    yield events
                if ended:
                    break
                outs = await stream.take_ready()
            yield SSE_DONE
        except Exception as e:  # a fault rendering this stream ends it alone, with an error
            log.exception("streaming %s failed", stream.request_id)
            yield APIError(500, f"internal error while streaming: {type(e).__name__}: {e}",
                           SERVER_ERROR, code="internal_error").sse_event()
            yield SSE_DONE
        finally:
            if not stream.finished:  # the client went away (the task was cancelled)
                self.ctx.engine.abort(stream.request_id)


async def _finals(ctx: ServingContext, request: Request,
                  stream: RequestStream) -> list[StreamOutput] | None:
    """The final output of each of the request's n sequences, by index (unstreamed: the
    only outputs are the last ones); None if the client went away."""
    finals: dict[int, StreamOutput] = {}
    while not stream.finished:
        out = await next_output(ctx, request, stream)
        if out is None:
            return None
        if (err := ended_error(out)) is not None:
            if not stream.finished:
                ctx.engine.abort(stream.request_id, "a sibling sequence failed")
            raise err
        finals[out.index] = out
    return [finals[i] for i in sorted(finals)]


def _render_events(chunks: Chunks, outs: list[StreamOutput], opening: bool,
                   all_ended: bool) -> tuple[bytes, bool]:
    """The events of outputs taken from a stream together (`opening`: the stream's first;
    `all_ended`: every sequence's final output is among them or came before), and
    whether the stream ends with them (done, or a sequence failed)."""
    events = [chunks.head(outs[0])] if opening else []
    for out in outs:
        if out.finished:
            err = ended_error(out)
            if err is not None:
                if out.text:
                    events.append(chunks.token(out))
                events.append(err.sse_event())
                return "".join(events).encode(), True
            events.append(chunks.tail(out))
        elif chunks.wants_chunk(out):
            events.append(chunks.token(out))
    if all_ended:
        events.append(chunks.usage())
    return "".join(events).encode(), all_ended
