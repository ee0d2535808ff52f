"""Server-sent events of one streamed request, in OpenAI's chunk shapes: `Chunks` renders
the first event (chat: the assistant role), one per token, and the last (finish reason,
then usage when asked for). `CompletionChunks` and `ChatChunks` give the two endpoints'
chunk models."""

from __future__ import annotations

import json

from pydantic import BaseModel

from stepserve.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    UsageInfo,
)
from stepserve.server.streams import StreamOutput

SSE_DONE = "data: [DONE]\n\n"


class Chunks:
    """Renders one request's SSE events. Token chunks come from a template made once
    from the pydantic chunk model (only the text changes), so a token costs one
    json.dumps; the first, last and usage chunks are rendered by pydantic."""

    SENTINEL = "\x00stepserve-text\x00"

    def __init__(self, rid: str, created: int, model: str,
                 body: CompletionRequest | ChatCompletionRequest) -> None:
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous_usage = bool(opts and opts.continuous_usage_stats)
        self.rid, self.created, self.model = rid, created, model
        data = self._chunk(self.SENTINEL, None, None).model_dump_json()
        self._prefix, self._suffix = data.split(json.dumps(self.SENTINEL))

    def head(self, first: StreamOutput) -> str:
        return ""

    def token(self, text: str, out: StreamOutput) -> str:
        if self.continuous_usage:
            return self._event(self._chunk(text, None, self._usage(out)))
        return f"data: {self._prefix}{json.dumps(text)}{self._suffix}\n\n"

    def tail(self, out: StreamOutput) -> str:
        usage = self._usage(out) if self.continuous_usage else None
        events = [self._event(self._chunk(out.text, out.finish_reason, usage))]
        if self.include_usage:
            events.append(self._event(self._usage_chunk(self._usage(out))))
        return "".join(events)

    @staticmethod
    def _usage(out: StreamOutput) -> UsageInfo:
        return UsageInfo.of(out.num_prompt_tokens, out.num_output_tokens)

    @staticmethod
    def _event(chunk: BaseModel) -> str:
        return f"data: {chunk.model_dump_json()}\n\n"

    def _chunk(self, text: str, finish_reason: str | None, usage: UsageInfo | None
               ) -> BaseModel:
        raise NotImplementedError

    def _usage_chunk(self, usage: UsageInfo) -> BaseModel:
        raise NotImplementedError


class CompletionChunks(Chunks):
    def _chunk(self, text, finish_reason, usage):
        return CompletionResponse(id=self.rid, created=self.created, model=self.model,
                                  choices=[CompletionChoice(text=text,
                                                            finish_reason=finish_reason)],
                                  usage=usage)

    def _usage_chunk(self, usage):
        return CompletionResponse(id=self.rid, created=self.created, model=self.model,
                                  choices=[], usage=usage)


class ChatChunks(Chunks):
    def head(self, first: StreamOutput) -> str:
        usage = UsageInfo.of(first.num_prompt_tokens, 0) if self.continuous_usage else None
        return self._event(self._make(DeltaMessage(role="assistant", content=""), None, usage))

    def _chunk(self, text, finish_reason, usage):
        delta = DeltaMessage(content=text) if text or finish_reason is None else DeltaMessage()
        return self._make(delta, finish_reason, usage)

    def _make(self, delta: DeltaMessage, finish_reason: str | None, usage: UsageInfo | None
              ) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.rid, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(delta=delta,
                                                            finish_reason=finish_reason)],
                                   usage=usage)

    def _usage_chunk(self, usage):
        return ChatCompletionChunk(id=self.rid, created=self.created, model=self.model,
                                   choices=[], usage=usage)
