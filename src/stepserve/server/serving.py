"""The two generation endpoints: turn a validated body into a prompt and SamplingParams,
submit it, and answer as one JSON body or as server-sent events.

Outcomes map to statuses before any header is sent whenever possible: the handler waits
for a request's first output before it starts a stream, so a queue timeout is still a
clean 503. Failures after the stream began are an SSE error event, then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from stepserve.request import SamplingParams
from stepserve.server.body import VALUE_SLACK, parse_json, read_limited
from stepserve.server.errors import (
    RATE_LIMIT,
    SERVER_ERROR,
    UNAVAILABLE,
    APIError,
    bad_request,
    from_validation_error,
)
from stepserve.server.prompts import (
    ServingContext,
    chat_prompt,
    check_common,
    check_length,
    completion_prompt,
    sampling_params,
)
from stepserve.server.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from stepserve.server.sse import SSE_DONE, ChatChunks, Chunks, CompletionChunks
from stepserve.server.streams import (
    EngineUnavailable,
    RequestFailed,
    RequestRejected,
    RequestStream,
    StreamOutput,
)

log = logging.getLogger("stepserve.server")


async def parse_body(ctx: ServingContext, request: Request,
                     model: type[BaseModel]) -> BaseModel:
    """Content type, size, UTF-8 and JSON checks (body.py), then strict validation; each
    failure a 4xx."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype!r}",
                       param=None, code="unsupported_media_type")
    raw = await read_limited(request, ctx.max_request_bytes)
    data = await parse_json(raw, ctx.max_model_len + VALUE_SLACK)
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        raise from_validation_error(e) from None


async def submit(ctx: ServingContext, ids: list[int], params: SamplingParams,
                 streamed: bool, arrival: float) -> RequestStream:
    try:
        return await ctx.engine.add(ids, params, streamed=streamed, arrival_time=arrival)
    except RequestRejected as e:
        if e.queue_full:
            raise APIError(429, f"the server is overloaded: {e.message}", RATE_LIMIT,
                           code="queue_full",
                           headers={"Retry-After": str(ctx.retry_after_s)}) from None
        code = "context_length_exceeded" if e.reason == "too_long" else e.reason
        raise bad_request(e.message, None, code) from None
    except RequestFailed as e:
        raise APIError(500, f"internal error: the engine could not take the request: {e}",
                       SERVER_ERROR, code="engine_error") from None
    except EngineUnavailable as e:
        code = "engine_error" if ctx.engine.fault else "shutting_down"
        raise APIError(503, f"the server cannot take requests: {e}", UNAVAILABLE,
                       code=code) from None


def ended_error(out: StreamOutput) -> APIError | None:
    """The error for a request that ended abnormally (None: it completed)."""
    if out.finish_reason in ("stop", "length"):
        return None
    if out.finish_reason == "timed_out":
        return APIError(503, f"the server is overloaded: the request {out.message}; retry "
                             "later", UNAVAILABLE, code="queue_timeout")
    if out.finish_reason == "abort":
        return APIError(503, f"request aborted: {out.message}", UNAVAILABLE,
                        code="aborted")
    return APIError(500, f"internal error: {out.message}", SERVER_ERROR, code="engine_error")


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


# ---- the endpoints ----

async def create_completion(ctx: ServingContext, request: Request) -> Response:
    arrival = ctx.engine.engine.clock.now()
    body = await parse_body(ctx, request, CompletionRequest)
    assert isinstance(body, CompletionRequest)
    check_common(ctx, body)
    ids = await completion_prompt(ctx, body)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    check_length(ctx, ids, max_tokens, "max_tokens", "prompt")
    stream = await submit(ctx, ids, sampling_params(body, max_tokens), body.stream, arrival)
    return await _answer(ctx, request, stream, body, "cmpl", CompletionChunks,
                         lambda rid, created, out: CompletionResponse(
        id=rid, created=created, model=ctx.model_name,
        choices=[CompletionChoice(text=out.full_text or "", finish_reason=out.finish_reason)],
        usage=UsageInfo.of(out.num_prompt_tokens, out.num_output_tokens)))


async def create_chat_completion(ctx: ServingContext, request: Request) -> Response:
    arrival = ctx.engine.engine.clock.now()
    body = await parse_body(ctx, request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    check_common(ctx, body)
    ids = await chat_prompt(ctx, body)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:  # as vLLM: whatever room the context leaves
        max_tokens = max(ctx.max_model_len - len(ids), 1)
    check_length(ctx, ids, max_tokens, param, "messages")
    stream = await submit(ctx, ids, sampling_params(body, max_tokens), body.stream, arrival)
    return await _answer(ctx, request, stream, body, "chatcmpl", ChatChunks,
                         lambda rid, created, out: ChatCompletionResponse(
        id=rid, created=created, model=ctx.model_name,
        choices=[ChatChoice(message=ChatResponseMessage(content=out.full_text or ""),
                            finish_reason=out.finish_reason)],
        usage=UsageInfo.of(out.num_prompt_tokens, out.num_output_tokens)))


async def _answer(ctx: ServingContext, request: Request, stream: RequestStream,
                  body: CompletionRequest | ChatCompletionRequest, id_prefix: str,
                  chunks: type[Chunks],
                  response: Callable[[str, int, StreamOutput], BaseModel]) -> Response:
    """Both endpoints' answer: server-sent events when the body asks for a stream, else
    the request's final output as `response(id, created, output)`."""
    rid = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    try:
        if body.stream:
            return await _start_stream(ctx, request, stream,
                                       chunks(rid, created, ctx.model_name, body))
        out = await _final(ctx, request, stream)
        if out is None:
            return Response(status_code=499)  # nobody is listening
        return JSONResponse(response(rid, created, out).model_dump())
    except BaseException:
        # A fault (or cancellation) in this handler: the request must not run on unread.
        # The error itself becomes a 500 in OpenAI's shape (api.py's handler).
        if not stream.finished:
            ctx.engine.abort(stream.request_id, "the request's handler failed")
        raise


async def _final(ctx: ServingContext, request: Request,
                 stream: RequestStream) -> StreamOutput | None:
    out = await next_output(ctx, request, stream)  # unstreamed: the only output is the last
    if out is not None and (err := ended_error(out)) is not None:
        raise err
    return out


# ---- streaming ----

async def _start_stream(ctx: ServingContext, request: Request, stream: RequestStream,
                        chunks: Chunks) -> Response:
    first = await next_output(ctx, request, stream)
    if first is None:
        return Response(status_code=499)
    if first.finished and (err := ended_error(first)) is not None:
        raise err  # still before any header: a proper status
    return StreamingResponse(_events(ctx, stream, first, chunks),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _events(ctx: ServingContext, stream: RequestStream, first: StreamOutput,
                  chunks: Chunks) -> AsyncIterator[str]:
    out = first
    try:
        yield chunks.head(first)
        while True:
            if out.finished:
                err = ended_error(out)
                if err is None:
                    yield chunks.tail(out)
                else:
                    if out.text:
                        yield chunks.token(out.text, out)
                    yield err.sse_event()
                break
            if out.text:
                yield chunks.token(out.text, out)
            out = await stream.__anext__()
        yield SSE_DONE
    except Exception as e:  # a fault rendering this stream ends it alone, with an error
        log.exception("streaming %s failed", stream.request_id)
        yield APIError(500, f"internal error while streaming: {type(e).__name__}: {e}",
                       SERVER_ERROR, code="internal_error").sse_event()
        yield SSE_DONE
    finally:
        if not stream.finished:  # the client went away (the task was cancelled)
            ctx.engine.abort(stream.request_id)

