"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Requests are strict (no "10" for 10, no "true" for true) and closed (an unknown field is
a 400 naming it). Fields OpenAI defines that this engine cannot honour (logprobs,
penalties, echo, tools ...) are accepted only at their neutral value, so a client that
sends the default still works and one that relies on the feature hears it clearly.
Scheduling hints ride along as in vLLM: `priority`, and the tenant from `user`.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from stepserve import request_limits as lim
from stepserve.server.errors import bad_request

# Bounded strings and lists (request_limits.py says why each bound)
StopString = Annotated[str, Field(max_length=lim.STOP_MAX_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=lim.INT32_MAX)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # Defined by OpenAI, not supported here: allowed only at these neutral values.
    _NEUTRAL: dict[str, tuple[Any, ...]] = {}

    @model_validator(mode="after")
    def _unsupported_at_neutral(self) -> _Request:
        for name, allowed in self._NEUTRAL.items():
            value = getattr(self, name)
            if value not in allowed:
                shown = " or ".join(json.dumps(a) for a in allowed)
                raise bad_request(f"{name} = {json.dumps(value)} is not supported by this "
                                  f"server (allowed: {shown})", name,
                                  "unsupported_value")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Request):
    """Fields both endpoints share."""

    model: str = Field(max_length=1024)
    max_tokens: int | None = Field(None, ge=1, le=lim.MAX_TOKENS_MAX)
    temperature: float | None = Field(None, ge=0.0, le=lim.TEMPERATURE_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=lim.TOP_K_MAX, description="0 or -1: off (vLLM)")
    seed: int | None = Field(None, ge=lim.SEED_MIN, le=lim.SEED_MAX)
    stop: StopString | list[StopString] | None = Field(None, max_length=lim.STOP_MAX_COUNT)
    stop_token_ids: list[TokenId] | None = Field(None, max_length=lim.STOP_TOKEN_IDS_MAX_COUNT)
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=lim.INT32_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=lim.TENANT_MAX_CHARS,
                             description="the tenant for the fair-share policy")
    priority: int = Field(0, ge=lim.PRIORITY_MIN, le=lim.PRIORITY_MAX,
                          description="lower runs first (priority policy), as in vLLM")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, max_length=300)

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


_NEUTRAL_SHARED: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0.0), "presence_penalty": (None, 0.0),
    "logit_bias": (None, {}),
}


class CompletionRequest(_Sampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="one prompt: text or token ids (a list of one prompt is accepted)")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=lim.INT32_MAX)
    suffix: str | None = Field(None, max_length=lim.STOP_MAX_CHARS)

    _NEUTRAL = {**_NEUTRAL_SHARED, "echo": (False,), "logprobs": (None,),
                "best_of": (None, 1), "suffix": (None, "")}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    content: str | list[TextPart] | None
    name: str | None = Field(None, max_length=lim.TENANT_MAX_CHARS)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ContentMessage(_Message):
    """A system, developer or user message: `content` is required, as in OpenAI."""

    role: Literal["system", "developer", "user"]
    content: str | list[TextPart]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None


def _message_kind(value: Any) -> str:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return "(assistant)" if role == "assistant" else "(content)"


# Tagged by role so the schema can say which messages need `content`. The tags are in
# parentheses so an error's location skips them (errors._is_branch).
ChatMessage = Annotated[Annotated[ContentMessage, Tag("(content)")]
                        | Annotated[AssistantMessage, Tag("(assistant)")],
                        Discriminator(_message_kind)]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=lim.MESSAGES_MAX_COUNT)
    max_completion_tokens: int | None = Field(None, ge=1, le=lim.MAX_TOKENS_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    _NEUTRAL = {**_NEUTRAL_SHARED, "logprobs": (None, False), "top_logprobs": (None, 0),
                "tools": (None, []), "tool_choice": (None, "none"),
                "response_format": (None, {"type": "text"})}


# ---- responses ----

class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "stepserve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error answer, in OpenAI's shape (errors.APIError)."""

    error: ErrorInfo


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
    num_requests_running: int
    num_requests_waiting: int
    steps: int
