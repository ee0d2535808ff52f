"""The two generation endpoints: turn a validated body into a prompt and SamplingParams
(the checks that need the model are in prompts.py), submit it, and hand it to its
`Answer` (answer.py): one JSON body of n choices, or server-sent events.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepserve.core.end_reasons import Refusal, end_reason
from stepserve.core.engine_core import default_max_tokens
from stepserve.engine.seam import (
    EngineUnavailable,
    NewRequest,
    RequestFailed,
    RequestRejected,
    RequestStream,
)
from stepserve.server.answer import Answer
from stepserve.server.body import VALUE_SLACK, parse_json, read_limited
from stepserve.server.errors import APIError, bad_request, from_validation_error
from stepserve.server.logprob_budget import chat_ask, check_logprob_budget, completion_ask
from stepserve.server.logprobs import LogprobRenderer
from stepserve.server.prompts import (
    ServingContext,
    chat_prompt,
    check_common,
    check_length,
    completion_prompt,
    sampling_params,
)
from stepserve.server.protocol import ChatCompletionRequest, CompletionRequest
from stepserve.server.sse import ChatChunks, CompletionChunks, Echo

log = logging.getLogger("stepserve.server")


async def read_json(ctx: ServingContext, request: Request) -> object:
    """Content type, size, UTF-8 and JSON checks (body.py); each failure a 4xx."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype!r}",
                       param=None, code="unsupported_media_type")
    raw = await read_limited(request, ctx.max_request_bytes)
    return await parse_json(raw, ctx.max_model_len + VALUE_SLACK)


def validate(data: object, model: type[BaseModel]) -> BaseModel:
    """Strict validation of a parsed body; a 400 naming the first problem."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        raise from_validation_error(e) from None


async def parse_body(ctx: ServingContext, request: Request,
                     model: type[BaseModel]) -> BaseModel:
    return validate(await read_json(ctx, request), model)


async def submit(ctx: ServingContext, request: NewRequest) -> RequestStream:
    try:
        return await ctx.engine.add(request)
    except RequestRejected as e:
        end = end_reason(e.reason)
        if e.code is not None:
            raise bad_request(e.message, e.param, e.code) from None
        retry = {"Retry-After": str(ctx.retry_after_s)} if end.retry_after else None
        raise APIError.of(end, e.message, e.param, headers=retry) from None
    except RequestFailed as e:
        raise APIError.of(end_reason(Refusal.FAILED), str(e)) from None
    except EngineUnavailable as e:
        why = Refusal.ENGINE_DOWN if ctx.engine.fault else Refusal.SHUTTING_DOWN
        raise APIError.of(end_reason(why), str(e)) from None


# ---- the endpoints ----

async def create_completion(ctx: ServingContext, request: Request) -> Response:
    arrival = ctx.clock.now()
    body = await parse_body(ctx, request, CompletionRequest)
    assert isinstance(body, CompletionRequest)
    check_common(ctx, body)
    ids = await completion_prompt(ctx, body)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    only_prompt = max_tokens == 0
    if only_prompt and not body.echo:
        raise bad_request("max_tokens = 0: must be at least 1 (0 only with echo: the "
                          "prompt's logprobs without generating)", "max_tokens")
    max_tokens = max(max_tokens, 1)  # echo with 0: one token is generated, not shown
    check_length(ctx, ids, max_tokens, "max_tokens", "prompt")
    prompt_lp = body.prompt_logprobs
    if prompt_lp is None and body.echo and body.logprobs is not None:
        prompt_lp = body.logprobs  # echo's logprobs start with the prompt's, as vLLM
    best_of = body.best_of if body.best_of is not None and body.best_of > body.n else None
    # best_of ranks the sequences by their tokens' logprobs: computed even when not shown
    logprobs = body.logprobs if best_of is None or body.logprobs is not None else 0
    params = sampling_params(body, max_tokens, logprobs, prompt_lp, best_of)
    check_logprob_budget(completion_ask(body, params.n, max_tokens, only_prompt, len(ids)))
    echo = None
    if body.echo:
        text = body.prompt if isinstance(body.prompt, str) else \
            body.prompt[0] if isinstance(body.prompt, list) and body.prompt \
            and isinstance(body.prompt[0], str) else \
            await ctx.off_loop(ctx.tokenizer.decode, ids)
        echo = Echo(text, ids, only_prompt)
    answer = Answer(ctx, body, "cmpl", _renderer(ctx, body.logprobs, prompt_lp), echo)
    stream = await submit(ctx, NewRequest(ids, params, body.stream, arrival_time=arrival,
                                          cache_salt=body.cache_salt))
    return await answer.send(request, stream, CompletionChunks, answer.completion)


async def create_chat_completion(ctx: ServingContext, request: Request) -> Response:
    arrival = ctx.clock.now()
    body = await parse_body(ctx, request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    check_common(ctx, body)
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs = true", "top_logprobs")
    ids = await chat_prompt(ctx, body)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:  # as vLLM: whatever room the context leaves
        max_tokens = default_max_tokens(ctx.max_model_len, len(ids))
    check_length(ctx, ids, max_tokens, param, "messages")
    check_logprob_budget(chat_ask(body, param, max_tokens, len(ids)))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, max_tokens, logprobs, body.prompt_logprobs)
    answer = Answer(ctx, body, "chatcmpl", _renderer(ctx, logprobs, body.prompt_logprobs))
    stream = await submit(ctx, NewRequest(ids, params, body.stream, arrival_time=arrival,
                                          cache_salt=body.cache_salt))
    return await answer.send(request, stream, ChatChunks, answer.chat)


def _renderer(ctx: ServingContext, logprobs: int | None,
              prompt_logprobs: int | None) -> LogprobRenderer | None:
    if logprobs is None and prompt_logprobs is None:
        return None
    return LogprobRenderer(ctx.tokenizer, logprobs or 0)

