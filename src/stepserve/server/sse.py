"""Server-sent events of one streamed request, in OpenAI's chunk shapes: `Chunks` renders
the first events (chat: the assistant role, once per choice), one per output (a choice's
new text and its tokens' logprobs), each choice's last (its finish reason), then the
usage when asked for. `CompletionChunks` and `ChatChunks` give the two endpoints' chunk
models; with n > 1 the choices' chunks interleave, each tagged with its index. A
completion choice's first chunk carries what comes once: the echoed prompt and vLLM's
prompt_logprobs (when asked for)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel

from stepserve.engine.seam import StreamOutput
from stepserve.server.logprobs import (
    JSONText,
    LogprobRenderer,
    output_entries,
    prompt_entries,
)
from stepserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from stepserve.server.responses import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
    RawBlocks,
    UsageInfo,
    prompt_cached_tokens,
)

SSE_DONE = "data: [DONE]\n\n"


@dataclass
class Echo:
    """A completion that starts with its prompt (echo): the prompt's text and ids; with
    `only_prompt` (max_tokens = 0) the generated token is not shown."""

    text: str
    prompt_ids: list[int]
    only_prompt: bool = False


class Chunks:
    """Renders one request's SSE events. A plain text chunk of choice 0 comes from a
    template made once from the pydantic chunk model (only the text changes), so a token
    costs one json.dumps; everything else is rendered by pydantic."""

    SENTINEL = "\x00stepserve-text\x00"

    def __init__(self, rid: str, created: int, model: str,
                 body: CompletionRequest | ChatCompletionRequest,
                 renderer: LogprobRenderer | None = None, echo: Echo | None = None) -> None:
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous_usage = bool(opts and opts.continuous_usage_stats)
        self.rid, self.created, self.model = rid, created, model
        self.n = body.n
        self.body = body
        self.renderer = renderer
        self.raw = RawBlocks()  # the rendered logprob blocks of the event being made
        self.echo = echo
        self._completion_tokens: dict[int, int] = {}
        self._cached_tokens: dict[int, int] = {}  # by choice: its prompt's cached tokens
        self._offsets: dict[int, int] = {}  # completions: text offset of the next token
        self._started: set[int] = set()  # choices that sent a chunk of their own
        self.num_prompt_tokens = 0
        data = self._chunk(0, None, None, self.SENTINEL).model_dump_json()
        self._prefix, self._suffix = data.split(json.dumps(self.SENTINEL))

    def head(self, first: StreamOutput) -> str:
        self.num_prompt_tokens = first.num_prompt_tokens
        return ""

    def wants_chunk(self, out: StreamOutput) -> bool:
        return bool(out.text or out.logprobs) or (out.index not in self._started
                                                   and self._opens_with_more())

    def _opens_with_more(self) -> bool:
        """Whether a choice's first chunk carries more than its text (echo)."""
        return self.echo is not None

    def token(self, out: StreamOutput) -> str:
        """A chunk of choice `out.index`'s new text (and its tokens' logprobs)."""
        self._completion_tokens[out.index] = out.num_output_tokens
        self._cached_tokens[out.index] = out.num_cached_tokens
        first = out.index not in self._started
        self._started.add(out.index)
        plain = (out.index == 0 and not self.continuous_usage and self.renderer is None
                 and (self.echo is None or not first))
        if plain:
            return f"data: {self._prefix}{json.dumps(out.text)}{self._suffix}\n\n"
        usage = self._usage_of(out) if self.continuous_usage else None
        return self._event(self._chunk(out.index, None, usage, *self._content(out, first)))

    def tail(self, out: StreamOutput) -> str:
        """Choice `out.index`'s last chunk (its finish reason)."""
        self._completion_tokens[out.index] = out.num_output_tokens
        self._cached_tokens[out.index] = out.num_cached_tokens
        first = out.index not in self._started
        self._started.add(out.index)
        usage = self._usage_of(out) if self.continuous_usage else None
        return self._event(self._chunk(out.index, out.finish_reason, usage,
                                       *self._content(out, first), stop_reason=out.stop_reason))

    def usage(self) -> str:
        """After every choice ended: the usage chunk, when asked for."""
        if not self.include_usage:
            return ""
        total = sum(self._completion_tokens.values())
        if self.echo is not None and self.echo.only_prompt:
            total = 0
        cached = prompt_cached_tokens(self._cached_tokens.values())
        return self._event(self._usage_chunk(UsageInfo.of(self.num_prompt_tokens, total,
                                                          cached)))

    def _content(self, out: StreamOutput, first: bool
                 ) -> tuple[str, JSONText | None, JSONText | None]:
        """The text, the logprobs block and the prompt_logprobs a chunk of `out` carries
        (`first`: the choice's first chunk), the blocks rendered."""
        raise NotImplementedError

    def _usage_of(self, out: StreamOutput) -> UsageInfo:
        return UsageInfo.of(out.num_prompt_tokens, out.num_output_tokens,
                            out.num_cached_tokens)

    def _event(self, chunk: BaseModel) -> str:
        return f"data: {self.raw.dump(chunk)}\n\n"

    def _chunk(self, index: int, finish_reason: str | None, usage: UsageInfo | None,
               text: str, logprobs: JSONText | None = None,
               prompt_logprobs: JSONText | None = None, *,
               stop_reason: str | int | None = None) -> BaseModel:
        """One choice's chunk; `stop_reason` only on its last (vLLM's: null before)."""
        raise NotImplementedError

    def _usage_chunk(self, usage: UsageInfo) -> BaseModel:
        raise NotImplementedError


class CompletionChunks(Chunks):
    body: CompletionRequest

    def _opens_with_more(self) -> bool:
        return self.echo is not None or self.body.prompt_logprobs is not None

    def _content(self, out, first):
        echo, renderer = self.echo, self.renderer
        only_prompt = echo is not None and echo.only_prompt
        text = "" if only_prompt else out.text
        entries = [] if only_prompt else output_entries(out.logprobs)
        if echo is not None and first:
            text = echo.text + text
            entries = prompt_entries(echo.prompt_ids, out.prompt_logprobs) + entries
        block = prompt = None
        if renderer is not None and self.body.logprobs is not None:
            block, self._offsets[out.index] = renderer.completion(
                entries, self._offsets.get(out.index, 0))
        if renderer is not None and self.body.prompt_logprobs is not None and first:
            prompt = renderer.vllm_prompt(out.prompt_logprobs or [])
        return text, block, prompt

    def _chunk(self, index, finish_reason, usage, text, logprobs=None, prompt_logprobs=None,
               *, stop_reason=None):
        choice = CompletionChoice(index=index, text=text, logprobs=self.raw.put(logprobs),
                                  finish_reason=finish_reason, stop_reason=stop_reason,
                                  prompt_logprobs=self.raw.put(prompt_logprobs))
        return CompletionResponse(id=self.rid, created=self.created, model=self.model,
                                  choices=[choice], usage=usage)

    def _usage_chunk(self, usage):
        return CompletionResponse(id=self.rid, created=self.created, model=self.model,
                                  choices=[], usage=usage)


class ChatChunks(Chunks):
    def head(self, first: StreamOutput) -> str:
        super().head(first)
        usage = UsageInfo.of(first.num_prompt_tokens, 0, first.num_cached_tokens) \
            if self.continuous_usage else None
        return "".join(self._event(self._make(i, DeltaMessage(role="assistant", content=""),
                                              None, usage, None)) for i in range(self.n))

    def _content(self, out, first):
        if self.renderer is None or not out.logprobs:
            return out.text, None, None
        return out.text, self.renderer.chat(out.logprobs), None

    def _chunk(self, index, finish_reason, usage, text, logprobs=None, prompt_logprobs=None,
               *, stop_reason=None):
        delta = DeltaMessage(content=text) if text or finish_reason is None else DeltaMessage()
        return self._make(index, delta, finish_reason, usage, logprobs, stop_reason)

    def _make(self, index: int, delta: DeltaMessage, finish_reason: str | None,
              usage: UsageInfo | None, logprobs,
              stop_reason: str | int | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.rid, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(index=index, delta=delta,
                                                            logprobs=self.raw.put(logprobs),
                                                            finish_reason=finish_reason,
                                                            stop_reason=stop_reason)],
                                   usage=usage)

    def _usage_chunk(self, usage):
        return ChatCompletionChunk(id=self.rid, created=self.created, model=self.model,
                                   choices=[], usage=usage)
