"""The two generation endpoints: turn a validated body into a prompt and SamplingParams,
submit it, and answer as one JSON body or as server-sent events.

Outcomes map to statuses before any header is sent whenever possible: the handler waits
for a request's first output before it starts a stream, so a queue timeout is still a
clean 503. Failures after the stream began are an SSE error event, then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from stepserve.request import SamplingParams
from stepserve.server.async_engine import AsyncEngine
from stepserve.server.errors import (
    RATE_LIMIT,
    SERVER_ERROR,
    UNAVAILABLE,
    APIError,
    bad_request,
    from_validation_error,
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
    _Sampling,
)
from stepserve.server.sse import SSE_DONE, ChatChunks, Chunks, CompletionChunks
from stepserve.server.streams import (
    EngineUnavailable,
    RequestRejected,
    RequestStream,
    StreamOutput,
)


@dataclass
class ServingContext:
    """What the handlers need from the app."""

    engine: AsyncEngine
    model_name: str
    max_model_len: int
    vocab_size: int
    retry_after_s: int


async def parse_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """Content type, UTF-8 and JSON checks, then strict validation; each failure a 4xx."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype!r}",
                       param=None, code="unsupported_media_type")
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the body is not valid UTF-8 (byte {e.start})", None,
                          "invalid_encoding") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise from_validation_error(e) from None


# ---- building the engine request ----

def _check_common(ctx: ServingContext, body: _Sampling) -> None:
    if body.model != ctx.model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                            f"{ctx.model_name!r} (see GET /v1/models)", param="model",
                       code="model_not_found")
    if body.n != 1:
        raise bad_request(f"n = {body.n}: only n = 1 is supported", "n", "unsupported_value")
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed when stream is true",
                          "stream_options")


def _check_length(ctx: ServingContext, ids: list[int], max_tokens: int, param: str,
                  prompt_param: str) -> None:
    limit = ctx.max_model_len
    if not ids:
        raise bad_request("the prompt is empty; at least one token is required",
                          prompt_param, "empty_prompt")
    if len(ids) + max_tokens > limit:
        where = prompt_param if len(ids) >= limit else param
        raise bad_request(f"prompt ({len(ids)} tokens) + {param} ({max_tokens}) = "
                          f"{len(ids) + max_tokens} exceeds max_model_len = {limit}; "
                          f"shorten the prompt or lower {param}", where,
                          "context_length_exceeded")


def _sampling_params(body: _Sampling, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(body.top_k or 0, 0), seed=body.seed, stop=body.stop_strings(),
            stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos,
            priority=body.priority, tenant=body.user or "default")
    except ValueError as e:
        raise bad_request(str(e)) from None


def completion_prompt(ctx: ServingContext, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request(f"prompt is a list of {len(prompt)} prompts; this server takes "
                              "one prompt per request", "prompt", "unsupported_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("the prompt is empty; at least one token is required",
                              "prompt", "empty_prompt")
        return ctx.engine.engine.tokenizer.encode(prompt)
    bad = [t for t in prompt if not 0 <= t < ctx.vocab_size]
    if bad:
        raise bad_request(f"prompt token ids must be in [0, {ctx.vocab_size}); got "
                          f"{bad[:5]}", "prompt")
    return list(prompt)


def chat_prompt(ctx: ServingContext, body: ChatCompletionRequest) -> list[int]:
    import jinja2

    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    tokenizer = ctx.engine.engine.tokenizer
    try:
        return tokenizer.encode_chat(messages)
    except jinja2.TemplateError as e:
        raise bad_request(f"the chat template rejected the messages: {e}", "messages") \
            from None
    except ValueError as e:  # no chat template
        raise bad_request(str(e), "messages") from None


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
    body = await parse_body(request, CompletionRequest)
    assert isinstance(body, CompletionRequest)
    _check_common(ctx, body)
    ids = completion_prompt(ctx, body)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    _check_length(ctx, ids, max_tokens, "max_tokens", "prompt")
    stream = await submit(ctx, ids, _sampling_params(body, max_tokens), body.stream, arrival)
    return await _answer(ctx, request, stream, body, "cmpl", CompletionChunks,
                         lambda rid, created, out: CompletionResponse(
        id=rid, created=created, model=ctx.model_name,
        choices=[CompletionChoice(text=out.full_text or "", finish_reason=out.finish_reason)],
        usage=UsageInfo.of(out.num_prompt_tokens, out.num_output_tokens)))


async def create_chat_completion(ctx: ServingContext, request: Request) -> Response:
    arrival = ctx.engine.engine.clock.now()
    body = await parse_body(request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    _check_common(ctx, body)
    ids = chat_prompt(ctx, body)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:  # as vLLM: whatever room the context leaves
        max_tokens = max(ctx.max_model_len - len(ids), 1)
    _check_length(ctx, ids, max_tokens, param, "messages")
    stream = await submit(ctx, ids, _sampling_params(body, max_tokens), body.stream, arrival)
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
    if body.stream:
        return await _start_stream(ctx, request, stream,
                                   chunks(rid, created, ctx.model_name, body))
    out = await _final(ctx, request, stream)
    if out is None:
        return Response(status_code=499)  # nobody is listening
    return JSONResponse(response(rid, created, out).model_dump())


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
    finally:
        if not stream.finished:  # the client went away (the task was cancelled)
            ctx.engine.abort(stream.request_id)

