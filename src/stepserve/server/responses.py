"""Response bodies of the two generation endpoints, as pydantic models in OpenAI's
shapes: completions and chat completions, their streamed chunks, usage, and the
logprobs blocks (with vLLM's prompt_logprobs).

Logprob blocks are rendered to JSON text (logprobs.py says why) and go into an answer
through `RawBlocks`: in the model a block's field holds a marker (a `Prebuilt` field
takes it unvalidated), and the dumped JSON gets the block's text where the marker came
out. The models stay the blocks' schema (/openapi.json) and what tests check answers
against.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, Field, SerializeAsAny, SkipValidation

T = TypeVar("T")
Prebuilt = SkipValidation[SerializeAsAny[T] | None]


class RawBlocks:
    """Rendered JSON blocks on their way into one answer's (or one stream's) JSON. A
    marker holds a random nonce: no text a client sends or a model writes passes for one."""

    def __init__(self) -> None:
        self._prefix = f"stepserve-raw-{secrets.token_hex(16)}-"
        self._blocks: list[str] = []

    def put(self, block: str | None) -> str | None:
        """The marker to put in the block's field (None stays None)."""
        if block is None:
            return None
        self._blocks.append(block)
        return f"{self._prefix}{len(self._blocks) - 1}"

    def dump(self, model: BaseModel) -> str:
        """`model`'s JSON with the blocks put since the last dump in their places."""
        text = model.model_dump_json()
        blocks, self._blocks = self._blocks, []
        if not blocks:
            return text
        first, *rest = text.split(f'"{self._prefix}')
        out = [first]
        for piece in rest:  # "<k>" then the JSON after the marker string
            k, _, after = piece.partition('"')
            out += (blocks[int(k)], after)
        return "".join(out)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV came from the prefix "
                                              "cache (a multiple of the block size)")


class UsageInfo(BaseModel):
    """OpenAI's usage. prompt_tokens_details is always there, as OpenAI sends it (vLLM
    only with --enable-prompt-tokens-details), so a client can read cached_tokens
    without guarding against a missing object."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int,
           cached_tokens: int = 0) -> UsageInfo:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


def prompt_cached_tokens(per_sequence: Iterable[int]) -> int:
    """A request's cached prompt tokens from its sequences' (n > 1: the prompt counted
    once): the fewest any got. A sibling admitted a step after another hits the blocks
    that one has just computed for this very request, which no earlier request cached."""
    return min(per_sequence, default=0)


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions logprobs: per token its text, offset in the choice's
    text, logprob, and the top alternatives (plus the token itself) as {text: logprob};
    a prompt's first token (echo) has null ones."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class VllmLogprob(BaseModel):
    """vLLM's prompt_logprobs entry (per prompt position: {token id: this})."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, VllmLogprob] | None]

# vLLM's stop_reason on every choice: the stop string or stop token id that ended it; null
# for EOS, length and every other end (streamed: null until the choice's last chunk)
StopReason = Annotated[int | str | None, Field(
    description="the stop string or stop token id that ended the choice, else null")]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: Prebuilt[CompletionLogprobs] = None
    finish_reason: str | None = None
    stop_reason: StopReason = None
    prompt_logprobs: Prebuilt[PromptLogprobs] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[TokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: Prebuilt[ChoiceLogprobs] = None
    finish_reason: str | None = None
    stop_reason: StopReason = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: Prebuilt[PromptLogprobs] = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: Prebuilt[ChoiceLogprobs] = None
    finish_reason: str | None = None
    stop_reason: StopReason = None  # streamed: on the chunk with the finish_reason


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
