"""The two generation endpoints: a validated body becomes the prompt's token ids and the
SamplingParams (with the checks that need the model's name and context; the engine checks
the rest), is submitted, and goes to its `Answer` (answer.py). Templating and tokenizing
run on a worker thread, and a text longer than any max_model_len prompt could be is
refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from stepserve.core import request_limits as lim
from stepserve.core.clock import Clock
from stepserve.core.end_reasons import Refusal, end_reason
from stepserve.core.engine_core import default_max_tokens
from stepserve.core.request import SamplingParams
from stepserve.engine.seam import (
    EngineUnavailable,
    NewRequest,
    RequestFailed,
    RequestRejected,
    RequestStream,
)
from stepserve.model.generation_config import SamplingDefaults
from stepserve.server.answer import Answer, ChatAnswer, CompletionAnswer, Echo, PromptStreams
from stepserve.server.body import parse_body
from stepserve.server.errors import APIError, bad_request
from stepserve.server.logprob_budget import chat_ask, check_logprob_budget, completion_ask
from stepserve.server.protocol import ChatCompletionRequest, CompletionRequest, _Sampling

if TYPE_CHECKING:
    from stepserve.engine.seam import EngineClient
    from stepserve.model.tokenizer import Tokenizer

log = logging.getLogger("stepserve.server")


@dataclass
class ServingContext:
    """What the handlers need from the app: the engine client (seam.py), and
    the model's tokenizer, limits and clock, for the work done before a request is
    sent (templating, tokenizing, the checks that need no engine)."""

    engine: EngineClient
    tokenizer: Tokenizer
    clock: Clock  # the engine's: a request's arrival is stamped on it
    model_name: str
    max_model_len: int
    vocab_size: int
    retry_after_s: int
    max_request_bytes: int
    # the longest text a prompt of max_model_len tokens can be (see max_token_bytes)
    max_prompt_chars: int
    # /v1/models' `root` (the model's folder: `vllm bench serve` reads its tokenizer
    # there) and the other names a request may give as `model` (--served-model-name a b)
    model_root: str | None = None
    model_aliases: tuple[str, ...] = ()
    # defaults for the sampling fields a request leaves out (--generation-config)
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    # usage's prompt_tokens_details (vLLM: --enable-prompt-tokens-details), and the
    # answers' system_fingerprint (fingerprint.py)
    enable_prompt_tokens_details: bool = False
    system_fingerprint: str | None = None
    workers: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=2, thread_name_prefix="stepserve-tokenize"))

    async def off_loop(self, fn, *args):
        """`fn(*args)` on a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.workers, fn, *args)


def served_names(given: str | list[str] | None, model: str) -> list[str]:
    """The names a request may give as `model`, the first the one answers carry."""
    if given is None or given == []:
        return [str(model)]
    return [given] if isinstance(given, str) else [str(n) for n in given]


def check_model(ctx: ServingContext, model: str | None) -> None:
    """`model` is optional (as in vLLM); when given it must be one of the served names."""
    if model is not None and model != ctx.model_name and model not in ctx.model_aliases:
        names = ", ".join(repr(n) for n in (ctx.model_name, *ctx.model_aliases))
        raise APIError(404, f"model {model!r} does not exist; this server serves "
                            f"{names} (see GET /v1/models)", param="model",
                       code="model_not_found")


def check_common(ctx: ServingContext, body: _Sampling) -> None:
    check_model(ctx, body.model)
    best_of = getattr(body, "best_of", None)
    if best_of is not None and best_of < body.n:
        raise bad_request(f"best_of = {best_of}: must be >= n = {body.n}", "best_of")
    if best_of is not None and best_of > body.n and body.stream:
        raise bad_request("best_of > n cannot be streamed (the best are known at the end)",
                          "best_of", "unsupported_value")
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed when stream is true",
                          "stream_options")


def check_length(ctx: ServingContext, ids: list[int], max_tokens: int, param: str,
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


def check_text_size(ctx: ServingContext, num_chars: int, param: str) -> None:
    """Before tokenizing: a text no prompt of max_model_len tokens can be is refused
    without the work."""
    if num_chars > ctx.max_prompt_chars:
        raise bad_request(
            f"the prompt has {num_chars} characters; no text over {ctx.max_prompt_chars} "
            f"characters fits in max_model_len = {ctx.max_model_len} tokens of this model",
            param, "context_length_exceeded")


def check_token_count(ctx: ServingContext, count: int, param: str) -> None:
    """A token sequence (to tokenize or detokenize) is no longer than a prompt can be, as
    vLLM's /tokenize and /detokenize refuse one over max_model_len."""
    if count > ctx.max_model_len:
        raise bad_request(f"{param} has {count} tokens, over max_model_len = "
                          f"{ctx.max_model_len} (no prompt of this model is longer)", param,
                          "context_length_exceeded")


def capped_max_tokens(ctx: ServingContext, max_tokens: int) -> int:
    """A request's max_tokens under the server-wide cap of the generation config's
    max_new_tokens, where it has one (vLLM's `--generation-config`)."""
    cap = ctx.sampling_defaults.max_tokens
    return max_tokens if cap is None else min(max_tokens, cap)


def _or(value, default, neutral):
    """A request's field, else the server's default for it, else vLLM's neutral value."""
    return value if value is not None else default if default is not None else neutral


def sampling_params(body: _Sampling, max_tokens: int, logprobs: int | None = None,
                    prompt_logprobs: int | None = None, n: int | None = None,
                    defaults: SamplingDefaults | None = None) -> SamplingParams:
    """The engine's params from a body (OpenAI's fields, then vLLM's extra ones); a field
    the body leaves out takes its default (`defaults`: --generation-config's). `n`: when
    the engine runs more sequences than the body's n (best_of)."""
    d = defaults or SamplingDefaults()
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_or(body.temperature, d.temperature, 1.0),
            top_p=_or(body.top_p, d.top_p, 1.0),
            top_k=max(_or(body.top_k, d.top_k, 0), 0), min_p=_or(body.min_p, d.min_p, 0.0),
            seed=body.seed,
            stop=body.stop_strings(), stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos, n=n or body.n, min_tokens=body.min_tokens,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=_or(body.repetition_penalty, d.repetition_penalty, 1.0),
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=body.skip_special_tokens,
            include_stop_str_in_output=body.include_stop_str_in_output,
            priority=body.priority, tenant=body.user or "default")
    except ValueError as e:
        raise bad_request(str(e)) from None


async def completion_prompts(ctx: ServingContext, body: CompletionRequest
                             ) -> list[tuple[str | list[int], list[int]]]:
    """Each prompt (one, or a list prompt's several) with its token ids."""
    prompt = body.prompt
    prompts = prompt if isinstance(prompt, list) and prompt \
        and isinstance(prompt[0], (str, list)) else [prompt]
    if len(prompts) > lim.PROMPTS_MAX_COUNT:
        raise bad_request(f"prompt is a list of {len(prompts)} prompts; at most "
                          f"{lim.PROMPTS_MAX_COUNT} in one request", "prompt")
    out: list[tuple[str | list[int], list[int]]] = []
    for k, one in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        if isinstance(one, str):
            if not one:
                raise bad_request(f"{where} is empty; at least one token is required",
                                  "prompt", "empty_prompt")
            check_text_size(ctx, len(one), "prompt")
            out.append((one, await ctx.off_loop(ctx.tokenizer.encode, one)))
        else:
            out.append((one, list(one)))  # their range is the engine's check
    return out


async def chat_prompt(ctx: ServingContext, body: ChatCompletionRequest,
                      add_generation_prompt: bool = True) -> list[int]:
    import jinja2

    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    check_text_size(ctx, sum(len(m["content"]) for m in messages), "messages")
    try:
        return await ctx.off_loop(ctx.tokenizer.encode_chat, messages, add_generation_prompt)
    except jinja2.TemplateError as e:
        raise bad_request(f"the chat template rejected the messages: {e}", "messages") \
            from None
    except ValueError as e:  # no chat template
        raise bad_request(str(e), "messages") from None


async def _answer(ctx: ServingContext, request: Request, answer: Answer,
                  prompts: list[list[int]], params: SamplingParams,
                  arrival: float) -> Response:
    """Submit the request (a list prompt: one engine request per prompt, answered as
    one) and answer it; a refusal as its error answer, the prompts already admitted
    aborted."""
    body = answer.body
    streams: list[RequestStream] = []
    try:
        for ids in prompts:
            streams.append(await ctx.engine.add(NewRequest(
                ids, params, body.stream, arrival_time=arrival, cache_salt=body.cache_salt)))
    except BaseException as e:
        for stream in streams:
            ctx.engine.abort(stream.request_id, "the request ended before all its prompts "
                             "were admitted")
        answer_error = _refusal(ctx, e)
        if answer_error is e:
            raise  # not a refusal (a cancellation, a fault): as it came, with its traceback
        raise answer_error from None
    stream = streams[0] if len(streams) == 1 else PromptStreams(streams, params.n)
    return await answer.send(request, stream)


def _refusal(ctx: ServingContext, e: BaseException) -> BaseException:
    """The error answer for an engine's refusal to take a request (else `e` itself)."""
    if isinstance(e, RequestRejected):
        end = end_reason(e.reason)
        if e.code is not None:
            return bad_request(e.message, e.param, e.code)
        retry = {"Retry-After": str(ctx.retry_after_s)} if end.retry_after else None
        return APIError.of(end, e.message, e.param, headers=retry)
    if isinstance(e, RequestFailed):
        return APIError.of(end_reason(Refusal.FAILED), str(e))
    if isinstance(e, EngineUnavailable):
        why = Refusal.ENGINE_DOWN if ctx.engine.fault else Refusal.SHUTTING_DOWN
        return APIError.of(end_reason(why), str(e))
    return e


async def create_completion(ctx: ServingContext, request: Request) -> Response:
    """OpenAI completions (body: protocol.CompletionRequest); a list prompt gets one
    choice per prompt and sequence, numbered prompt-major as vLLM does."""
    arrival = ctx.clock.now()
    body = await parse_body(ctx, request, CompletionRequest)
    check_common(ctx, body)
    prompts = await completion_prompts(ctx, body)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    only_prompt = max_tokens == 0
    if only_prompt and not body.echo:
        raise bad_request("max_tokens = 0: must be at least 1 (0 only with echo: the "
                          "prompt's logprobs without generating)", "max_tokens")
    max_tokens = max(max_tokens, 1)  # echo with 0: one token is generated, not shown
    max_tokens = capped_max_tokens(ctx, max_tokens)
    for _, ids in prompts:
        check_length(ctx, ids, max_tokens, "max_tokens", "prompt")
    prompt_lp = body.prompt_logprobs
    if prompt_lp is None and body.echo and body.logprobs is not None:
        prompt_lp = body.logprobs  # echo's logprobs start with the prompt's, as vLLM
    best_of = body.best_of if body.best_of is not None and body.best_of > body.n else None
    # best_of ranks the sequences by their tokens' logprobs: computed even when not shown
    logprobs = body.logprobs if best_of is None or body.logprobs is not None else 0
    params = sampling_params(body, max_tokens, logprobs, prompt_lp, best_of,
                             ctx.sampling_defaults)
    longest = max(len(ids) for _, ids in prompts)
    check_logprob_budget(completion_ask(body, params.n * len(prompts), max_tokens,
                                        only_prompt, longest))
    echoes = []
    if body.echo:
        for prompt, ids in prompts:
            text = prompt if isinstance(prompt, str) else \
                await ctx.off_loop(ctx.tokenizer.decode, ids)
            echoes.append(Echo(text, ids, only_prompt))
    answer = CompletionAnswer(ctx, body, body.logprobs, prompt_lp, echoes, len(prompts),
                              params.n)
    return await _answer(ctx, request, answer, [ids for _, ids in prompts], params,
                         arrival)


async def create_chat_completion(ctx: ServingContext, request: Request) -> Response:
    """OpenAI chat completions (body: protocol.ChatCompletionRequest)."""
    arrival = ctx.clock.now()
    body = await parse_body(ctx, request, ChatCompletionRequest)
    check_common(ctx, body)
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs = true", "top_logprobs")
    ids = await chat_prompt(ctx, body)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:  # as vLLM: whatever room the context leaves
        max_tokens = default_max_tokens(ctx.max_model_len, len(ids))
    max_tokens = capped_max_tokens(ctx, max_tokens)
    check_length(ctx, ids, max_tokens, param, "messages")
    check_logprob_budget(chat_ask(body, param, max_tokens, len(ids)))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, max_tokens, logprobs, body.prompt_logprobs,
                             defaults=ctx.sampling_defaults)
    answer = ChatAnswer(ctx, body, logprobs, body.prompt_logprobs, seqs=params.n)
    return await _answer(ctx, request, answer, [ids], params, arrival)

