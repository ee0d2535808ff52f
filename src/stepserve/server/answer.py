"""Answering one admitted request: its n sequences' final outputs as one JSON body, or
server-sent events in OpenAI's chunk shapes as they come (n > 1: chunks interleave,
tagged by index).

A stream starts only after the request's first output, so an early abnormal end (a queue
timeout) still gets a proper status; later it is an SSE error event, then `[DONE]`. One
failed sequence of n ends the whole request. An answer that can be big (logprobs, echo,
n > 1) is rendered on a worker thread, since it would hold up every other stream's
tokens; a plain stream's chunks stay on the loop (one json.dumps, cheaper than a hand-off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from stepserve.core import request_limits as lim
from stepserve.core.end_reasons import end_of
from stepserve.engine.seam import RequestStream, StreamOutput
from stepserve.server.errors import SERVER_ERROR, APIError
from stepserve.server.logprobs import (
    JSONText,
    LogprobRenderer,
    output_entries,
    prompt_entries,
    render_thread,
)
from stepserve.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    RawBlocks,
    UsageInfo,
)

if TYPE_CHECKING:
    from stepserve.server.serving import ServingContext

log = logging.getLogger("stepserve.server")

SSE_DONE = "data: [DONE]\n\n"

# Big answers are rendered here. Two threads: one long render does not hold up the next
# answer's, yet a burst of them queues instead of piling threads onto the interpreter
# lock that the event loop and the engine thread need too.
_RENDER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stepserve-render",
                             initializer=render_thread)

R = TypeVar("R")


@dataclass
class Echo:
    """A completion that starts with its prompt (echo): the prompt's text and ids; with
    `only_prompt` (max_tokens = 0) the generated token is not shown."""

    text: str
    prompt_ids: list[int]
    only_prompt: bool = False


def ended_error(out: StreamOutput) -> APIError | None:
    """The error for a request that ended abnormally (None: it completed)."""
    end = end_of(out.finish_reason)
    return None if end.completed else APIError.of(end, out.message)


def abort(ctx: ServingContext, stream: RequestStream,
          message: str = "aborted by the client") -> None:
    """End every engine request the stream answers (a list prompt's all)."""
    for request_id in stream.request_ids:
        ctx.engine.abort(request_id, message)


class PromptStreams(RequestStream):
    """The streams of a list prompt's requests (one per prompt, `seqs` sequences each)
    as one: choice `index` is prompt * seqs + sequence, as vLLM numbers them, and it is
    finished once every prompt's is."""

    def __init__(self, streams: list[RequestStream], seqs: int) -> None:
        super().__init__(streams[0].request_id, streams[0].num_prompt_tokens,
                         seqs * len(streams))
        self.streams, self.seqs = streams, seqs
        self._taken: list[StreamOutput] = []  # for __anext__: taken, not handed out yet

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(s.request_id for s in self.streams)

    @property
    def has_ready(self) -> bool:
        return bool(self._taken) or any(s.has_ready for s in self.streams)

    def take_now(self) -> list[StreamOutput]:
        outs, self._taken = self._taken, []
        for k, s in enumerate(self.streams):
            for out in s.take_now():
                out.index += k * self.seqs
                outs.append(out)
        self.finished = all(s.finished for s in self.streams)
        return outs

    async def wait_ready(self) -> None:
        if self.has_ready:
            return
        waits = [asyncio.ensure_future(s.wait_ready()) for s in self.streams
                 if not s.finished]
        if not waits:  # every prompt's stream has ended: nothing more will come
            return
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def __anext__(self) -> StreamOutput:
        if not self._taken:
            if self.finished:
                raise StopAsyncIteration
            await self.wait_ready()
            self._taken = self.take_now()
            self.finished = False  # until the last taken one is handed out
        out = self._taken.pop(0)
        self.finished = not self._taken and all(s.finished for s in self.streams)
        return out


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
            abort(ctx, stream)
    return get.result() if get.done() and not get.cancelled() else None


def response_id(request: Request, given_in_body: str | None, prefix: str) -> str:
    """`{prefix}-{id}`: the X-Request-Id header, else the body's request_id (vLLM), else
    a random one."""
    given = request.headers.get("x-request-id") or given_in_body
    if given and len(given) <= lim.REQUEST_ID_MAX_CHARS:
        return f"{prefix}-{given}"
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Answer:
    """How one request is answered: one JSON body of its n choices (`response`), or
    server-sent events: `head`, a chunk per output with new text and each choice's last
    (`token`), then `usage` when asked for. A plain text chunk of choice 0 comes from a
    template made once from the chunk model, so a token costs one json.dumps."""

    PREFIX: ClassVar[str]  # of the response id
    CHUNK: ClassVar[type[CompletionChunk | ChatCompletionChunk]]  # a streamed chunk
    SENTINEL = "\x00stepserve-text\x00"

    def __init__(self, ctx: ServingContext, body: CompletionRequest | ChatCompletionRequest,
                 logprobs: int | None, prompt_logprobs: int | None,
                 echoes: list[Echo] | None = None, num_prompts: int = 1,
                 seqs: int = 1) -> None:
        """`logprobs`, `prompt_logprobs`: the top alternatives shown (None: no block);
        `echoes`: each prompt's (echo); `num_prompts` prompts (a list prompt) of `seqs`
        sequences each (n, or best_of when it runs more)."""
        self.ctx, self.body, self.rid, self.echoes = ctx, body, "", echoes or []
        self.num_prompts, self.seqs = num_prompts, seqs
        self.show_prompt_logprobs = prompt_logprobs is not None
        self.renderer = None if logprobs is None and prompt_logprobs is None \
            else LogprobRenderer(ctx.tokenizer, logprobs or 0)
        self.raw = RawBlocks()  # the rendered logprob blocks of the body or event being made
        self.created = int(time.time())
        self.big = self.renderer is not None or bool(self.echoes) or body.n > 1 \
            or num_prompts > 1 \
            or getattr(body, "best_of", None) is not None
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous_usage = bool(opts and opts.continuous_usage_stats)
        self._last: dict[int, StreamOutput] = {}  # by choice: its latest output with a chunk
        self._offsets: dict[int, int] = {}  # completions: text offset of the next token
        self._prefix = self._suffix = ""  # of the plain chunk's template

    async def render(self, fn: Callable[..., R], *args) -> R:
        """`fn(*args)`: on a render thread when the answer can be big, else here."""
        if not self.big:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(_RENDER, fn, *args)

    async def send(self, request: Request, stream: RequestStream) -> Response:
        self.rid = response_id(request, self.body.request_id, self.PREFIX)
        try:
            if self.body.stream:
                return await self._start_stream(request, stream)
            outs = await _finals(self.ctx, request, stream)
            if outs is None:
                return Response(status_code=499)  # nobody is listening
            body = await self.render(lambda: self.raw.dump(self.response(outs)).encode())
            return Response(body, media_type="application/json")
        except BaseException:
            # A fault (or cancellation) in this handler: the request must not run on
            # unread. The error itself becomes a 500 in OpenAI's shape (api.py's handler).
            if not stream.finished:
                abort(self.ctx, stream, "the request's handler failed")
            raise

    def echo_of(self, index: int) -> Echo | None:
        """The echo of choice `index`'s prompt (None: no echo)."""
        return self.echoes[index // self.seqs] if self.echoes else None

    def usage_of(self, outs: list[StreamOutput]) -> UsageInfo:
        """The usage of the sequences whose last outputs are `outs` (best_of: every
        sequence run counts), each prompt counted once. Its cached tokens are the fewest
        any of its sequences got: a sibling admitted a step after another hits the
        blocks that one has just computed for this very request, which no earlier one
        cached."""
        made = sum(o.num_output_tokens for o in outs)
        if self.echoes and self.echoes[0].only_prompt:
            made = 0
        by_prompt: dict[int, list[StreamOutput]] = {}
        for o in outs:
            by_prompt.setdefault(o.index // self.seqs, []).append(o)
        return self.usage_info(
            sum(group[0].num_prompt_tokens for group in by_prompt.values()), made,
            sum(min(o.num_cached_tokens for o in group) for group in by_prompt.values()))

    def usage_info(self, prompt_tokens: int, made: int, cached_tokens: int) -> UsageInfo:
        return UsageInfo.of(prompt_tokens, made, cached_tokens,
                            self.ctx.enable_prompt_tokens_details, self.body.stream)

    # ---- the endpoint's shapes: response(outs), the JSON body of the sequences' final
    # outputs; _chunk, one choice's chunk (`end`: the choice's final output, on its last
    # chunk: the finish and stop reasons, which vLLM sends only there); _content, the
    # text, logprobs block and prompt_logprobs block a choice's piece carries (`text`:
    # its new text; `first`: the choice's first piece) ----

    def response(self, outs: list[StreamOutput]) -> BaseModel:
        raise NotImplementedError

    def _chunk(self, index: int, text: str, end: StreamOutput | None = None,
               usage: UsageInfo | None = None, logprobs: JSONText | None = None,
               prompt_logprobs: JSONText | None = None) -> BaseModel:
        raise NotImplementedError

    def _content(self, out: StreamOutput, text: str, first: bool
                 ) -> tuple[str, JSONText | None, JSONText | None]:
        raise NotImplementedError

    def _opens_with_more(self) -> bool:
        """Whether a choice's first chunk carries more than its text (echo)."""
        return False

    def _wrap(self, choices: list, usage: UsageInfo | None, last: bool = False,
              **fields) -> BaseModel:
        """A chunk; `last`: the stream's closing one for its choice, which carries the
        fingerprint as vLLM's (the usage chunk does when there is one)."""
        fingerprint = self.ctx.system_fingerprint \
            if last and (usage is not None or not self.include_usage) else None
        return self.CHUNK(id=self.rid, created=self.created, model=self.ctx.model_name,
                          choices=choices, usage=usage, system_fingerprint=fingerprint,
                          **fields)

    # ---- server-sent events ----

    def head(self, first: StreamOutput) -> str:
        return ""

    def wants_chunk(self, out: StreamOutput) -> bool:
        return bool(out.text or out.logprobs) or (out.index not in self._last
                                                   and self._opens_with_more())

    def token(self, out: StreamOutput, last: bool = False) -> str:
        """A chunk of choice `out.index`'s new text (and its tokens' logprobs); `last`:
        the choice's last chunk (its finish reason)."""
        first = out.index not in self._last
        self._last[out.index] = out
        if not last and out.index == 0 and not self.continuous_usage \
                and self.renderer is None and (not self.echoes or not first):
            return f"data: {self._prefix}{json.dumps(out.text)}{self._suffix}\n\n"
        text, block, prompt = self._content(out, out.text, first)
        usage = self.usage_info(out.num_prompt_tokens, out.num_output_tokens,
                                out.num_cached_tokens) if self.continuous_usage else None
        return self._event(self._chunk(out.index, text, out if last else None, usage,
                                       block, prompt))

    def usage(self) -> str:
        """After every choice ended: the usage chunk, when asked for."""
        if not self.include_usage:
            return ""
        return self._event(self._wrap([], self.usage_of(list(self._last.values())),
                                      last=True))

    def _event(self, chunk: BaseModel) -> str:
        return f"data: {self.raw.dump(chunk)}\n\n"

    async def _start_stream(self, request: Request, stream: RequestStream) -> Response:
        first = await next_output(self.ctx, request, stream)
        if first is None:
            return Response(status_code=499)
        if first.finished and (err := ended_error(first)) is not None:
            raise err  # still before any header: a proper status
        data = self._chunk(0, self.SENTINEL).model_dump_json()
        self._prefix, self._suffix = data.split(json.dumps(self.SENTINEL))
        return StreamingResponse(self._events(stream, first),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _events(self, stream: RequestStream,
                      first: StreamOutput) -> AsyncIterator[bytes | str]:
        outs, opening = [first], True
        try:
            while True:
                events, ended = await self.render(self._render_events, outs, opening,
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
                abort(self.ctx, stream)

    def _render_events(self, outs: list[StreamOutput], opening: bool,
                       all_ended: bool) -> tuple[bytes, bool]:
        """The events of outputs taken from a stream together (`opening`: the stream's
        first; `all_ended`: every sequence's final output is among them or came before),
        and whether the stream ends with them (done, or a sequence failed)."""
        events = [self.head(outs[0])] if opening else []
        for out in outs:
            if out.finished:
                err = ended_error(out)
                if err is not None:
                    if out.text:
                        events.append(self.token(out))
                    events.append(err.sse_event())
                    return "".join(events).encode(), True
                events.append(self.token(out, last=True))
            elif self.wants_chunk(out):
                events.append(self.token(out))
        if all_ended:
            events.append(self.usage())
        return "".join(events).encode(), all_ended


class CompletionAnswer(Answer):
    PREFIX, CHUNK = "cmpl", CompletionChunk
    body: CompletionRequest

    def _opens_with_more(self) -> bool:
        return bool(self.echoes) or self.show_prompt_logprobs

    def _content(self, out, text, first):
        echo, renderer = self.echo_of(out.index), self.renderer
        only_prompt = echo is not None and echo.only_prompt
        text = "" if only_prompt else text
        entries = [] if only_prompt else output_entries(out.logprobs)
        if echo is not None and first:
            text = echo.text + text
            entries = prompt_entries(echo.prompt_ids, out.prompt_logprobs) + entries
        block = prompt = None
        if renderer is not None and self.body.logprobs is not None:
            block, self._offsets[out.index] = renderer.completion(
                entries, self._offsets.get(out.index, 0))
        if renderer is not None and self.show_prompt_logprobs and first:
            prompt = renderer.vllm_prompt(out.prompt_logprobs or [])
        return text, block, prompt

    def _chunk(self, index, text, end=None, usage=None, logprobs=None,
               prompt_logprobs=None):
        extra = {} if prompt_logprobs is None else \
            {"prompt_logprobs": self.raw.put(prompt_logprobs)}
        return self._wrap([CompletionChoice(
            index=index, text=text, logprobs=self.raw.put(logprobs),
            finish_reason=None if end is None else end.finish_reason,
            stop_reason=None if end is None else end.stop_reason, **extra)],
            usage, last=end is not None)

    def response(self, outs):
        usage = self.usage_of(outs)
        shown = [(o, o.index) for o in outs]
        if self.seqs > self.body.n:  # best_of: each prompt's n with the highest logprob
            shown = []
            for p in range(self.num_prompts):
                group = sorted((o for o in outs if o.index // self.seqs == p),
                               key=lambda o: -sum(lp.logprob for lp in o.logprobs or ()))
                shown += [(o, p * self.body.n + k) for k, o in enumerate(group[:self.body.n])]
        choices = []
        for o, index in shown:
            text, block, prompt = self._content(o, o.full_text or "", True)
            choices.append(CompletionChoice(
                index=index, text=text, logprobs=self.raw.put(block),
                finish_reason=o.finish_reason, stop_reason=o.stop_reason,
                prompt_logprobs=self.raw.put(prompt), routed_experts=None))
        return CompletionResponse(id=self.rid, created=self.created,
                                  model=self.ctx.model_name, choices=choices, usage=usage,
                                  system_fingerprint=self.ctx.system_fingerprint)


class ChatAnswer(Answer):
    PREFIX, CHUNK = "chatcmpl", ChatCompletionChunk
    body: ChatCompletionRequest

    def head(self, first):
        usage = self.usage_info(first.num_prompt_tokens, 0, first.num_cached_tokens) \
            if self.continuous_usage else None
        return "".join(self._event(self._wrap(
            [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))],
            usage, prompt_token_ids=None, prompt_text=None)) for i in range(self.body.n))

    def _content(self, out, text, first):
        if self.renderer is None or not out.logprobs:
            return text, None, None
        return text, self.renderer.chat(out.logprobs), None

    def _chunk(self, index, text, end=None, usage=None, logprobs=None,
               prompt_logprobs=None):
        delta = DeltaMessage(content=text) if text or end is None else DeltaMessage()
        extra = {} if end is None else {"finish_reason": end.finish_reason,
                                        "stop_reason": end.stop_reason}
        return self._wrap([ChatChunkChoice(index=index, delta=delta,
                                           logprobs=self.raw.put(logprobs), token_ids=None,
                                           **extra)], usage, last=end is not None)

    def response(self, outs):
        renderer, body = self.renderer, self.body
        answer = ChatCompletionResponse(
            id=self.rid, created=self.created, model=self.ctx.model_name,
            system_fingerprint=self.ctx.system_fingerprint, usage=self.usage_of(outs),
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
                abort(ctx, stream, "a sibling sequence failed")
            raise err
        finals[out.index] = out
    return [finals[i] for i in sorted(finals)]
