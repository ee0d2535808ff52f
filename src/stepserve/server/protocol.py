"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Requests are strict (no "10" for 10) and bounded (request_limits.py). An unknown field
is ignored with a warning naming it, as vLLM does, so bodies built for vLLM work; vLLM's
extra sampling fields are honoured. Fields OpenAI defines that this engine cannot honour
(logit_bias, suffix, tools ...) are accepted only at their neutral value. The tenant for
fair share comes from `user`.

Logprob blocks are rendered to JSON text (logprobs.py says why) and enter an answer
through `RawBlocks`: the model's field holds a marker, replaced by the block's text in
the dumped JSON, so the models stay the blocks' schema (/openapi.json).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializeAsAny,
    SkipValidation,
    Tag,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from stepserve.core import request_limits as lim
from stepserve.server.errors import bad_request

# Bounded strings and lists (request_limits.py says why each bound)
StopString = Annotated[str, Field(max_length=lim.STOP_MAX_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=lim.INT32_MAX)]

log = logging.getLogger("stepserve.server")

# how much of the unknown field names one warning shows (a body can hold thousands)
WARN_FIELDS_MAX, WARN_NAME_CHARS = 8, 64


class _Lenient(BaseModel):
    """Unknown fields are ignored with a warning naming them (vLLM's behaviour)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _warn_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        result = handler(data)
        if isinstance(data, dict):
            known = cls.model_fields
            unknown = [str(k) for k in data if k not in known]
            if unknown:
                shown = [k[:WARN_NAME_CHARS] for k in unknown[:WARN_FIELDS_MAX]]
                more = f" and {len(unknown) - len(shown)} more" if len(unknown) > len(shown) \
                    else ""
                log.warning("The following fields were present in the request but ignored: "
                            "%s%s", shown, more)
        return result


class _Request(_Lenient):

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


class StreamOptions(_Lenient):

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Request):
    """Fields both endpoints share (OpenAI's, then vLLM's extra ones)."""

    model: str | None = Field(None, max_length=1024,
                              description="optional: the served model (see /v1/models)")
    max_tokens: int | None = Field(None, ge=1, le=lim.MAX_TOKENS_MAX)
    temperature: float | None = Field(None, ge=0.0, le=lim.TEMPERATURE_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=lim.SEED_MIN, le=lim.SEED_MAX)
    stop: StopString | list[StopString] | None = Field(None, max_length=lim.STOP_MAX_COUNT)
    n: int = Field(1, ge=1, le=lim.N_MAX, description="parallel samples (choices)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=lim.TENANT_MAX_CHARS,
                             description="the tenant for the fair-share policy")
    frequency_penalty: float | None = Field(None, ge=lim.PENALTY_MIN, le=lim.PENALTY_MAX)
    presence_penalty: float | None = Field(None, ge=lim.PENALTY_MIN, le=lim.PENALTY_MAX)
    logit_bias: dict[str, float] | None = Field(None, max_length=300)
    # vLLM's extra sampling fields
    top_k: int | None = Field(None, ge=-1, le=lim.TOP_K_MAX, description="0 or -1: off (vLLM)")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=lim.REPETITION_PENALTY_MAX)
    min_tokens: int = Field(0, ge=0, le=lim.MAX_TOKENS_MAX)
    stop_token_ids: list[TokenId] | None = Field(None, max_length=lim.STOP_TOKEN_IDS_MAX_COUNT)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=lim.LOGPROBS_MAX)
    request_id: str | None = Field(None, max_length=lim.REQUEST_ID_MAX_CHARS,
                                   description="the response id's suffix (vLLM)")
    priority: int = Field(0, ge=lim.PRIORITY_MIN, le=lim.PRIORITY_MAX,
                          description="lower runs first (priority policy), as in vLLM")
    cache_salt: str | None = Field(None, min_length=1, max_length=lim.CACHE_SALT_MAX_CHARS,
                                   description="the prefix cache's namespace: requests of "
                                               "different salts share no cached block (vLLM)")

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


_NEUTRAL_SHARED: dict[str, tuple[Any, ...]] = {"logit_bias": (None, {})}


class CompletionRequest(_Sampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="one prompt: text or token ids (a list of one prompt is accepted)")
    max_tokens: int | None = Field(None, ge=0, le=lim.MAX_TOKENS_MAX,
                                   description="0 only with echo (the prompt's logprobs)")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=lim.LOGPROBS_MAX)
    best_of: int | None = Field(None, ge=1, le=lim.N_MAX,
                                description="run this many, return the n likeliest "
                                            "(not streamed)")
    suffix: str | None = Field(None, max_length=lim.STOP_MAX_CHARS)

    _NEUTRAL = {**_NEUTRAL_SHARED, "suffix": (None, "")}


class TextPart(_Lenient):

    type: Literal["text"]
    text: str


class _Message(_Lenient):

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
# parentheses so an error's location skips them (errors._loc).
ChatMessage = Annotated[Annotated[ContentMessage, Tag("(content)")]
                        | Annotated[AssistantMessage, Tag("(assistant)")],
                        Discriminator(_message_kind)]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=lim.MESSAGES_MAX_COUNT)
    max_completion_tokens: int | None = Field(None, ge=1, le=lim.MAX_TOKENS_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=lim.LOGPROBS_MAX)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # OpenAI's older spelling of tools and tool_choice: refused alike, not ignored
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    _NEUTRAL = {**_NEUTRAL_SHARED, "tools": (None, []), "tool_choice": (None, "none"),
                "functions": (None, []), "function_call": (None, "none"),
                "response_format": (None, {"type": "text"})}


# vLLM's /tokenize and /detokenize (api.py)

class TokenizeCompletionRequest(_Lenient):
    model: str | None = Field(None, max_length=1024)
    prompt: str = Field(max_length=lim.MAX_REQUEST_BYTES_MAX)
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatCompletionRequest):
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Lenient):
    model: str | None = Field(None, max_length=1024)
    tokens: list[TokenId]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


# ---- responses ----

class ModelPermission(BaseModel):
    """vLLM's (OpenAI's old shape): a served model may be sampled, with logprobs."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex[:16]}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    """One served name, as vLLM lists it: `root` is the model's folder (where a client
    such as `vllm bench serve` finds the tokenizer), `parent` a LoRA's base (none here)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "stepserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)


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


class _Unsent:
    """A field's value in a chunk that does not carry the field at all (vLLM leaves
    `stop_reason` out until a choice's last chunk, `role` after the first delta)."""

    def __repr__(self) -> str:
        return "UNSENT"


UNSENT: Any = _Unsent()


def _unsent(value: Any) -> bool:
    return value is UNSENT


def sometimes(default: Any = UNSENT, **kw: Any) -> Any:
    """A field left out of the JSON while it holds UNSENT (a factory gives the default,
    so the JSON schema shows none)."""
    if default is UNSENT:
        return Field(default_factory=lambda: UNSENT, exclude_if=_unsent, **kw)
    return Field(default, exclude_if=_unsent, **kw)


def when_given(**kw: Any) -> Any:
    """A field left out of the JSON while it is None."""
    return Field(None, exclude_if=lambda v: v is None, **kw)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV came from the prefix "
                                              "cache (a multiple of the block size)")
    # vLLM's, null in an unstreamed answer and absent from a stream's usage: tokens
    # written to an external cache, multimodal tokens (neither exists here)
    created_cache_tokens: None = sometimes()
    multimodal_tokens: None = sometimes()


class UsageInfo(BaseModel):
    """OpenAI's usage as vLLM sends it (ServingContext.usage): prompt_tokens_details
    only with --enable-prompt-tokens-details (else null; absent in a stream), and a null
    completion_tokens_details in an unstreamed answer."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = sometimes()
    completion_tokens_details: None = sometimes()

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
           details: bool = False, streamed: bool = False) -> UsageInfo:
        """`details`: with prompt_tokens_details; `streamed`: a stream's usage chunk."""
        shown: dict[str, Any] = {} if streamed else {"completion_tokens_details": None,
                                                     "prompt_tokens_details": None}
        if details:
            shown["prompt_tokens_details"] = \
                PromptTokensDetails(cached_tokens=cached_tokens) if streamed else \
                PromptTokensDetails(cached_tokens=cached_tokens, created_cache_tokens=None,
                                    multimodal_tokens=None)
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens, **shown)


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
    # vLLM's, null: the ids are not returned (return_token_ids is not supported)
    token_ids: None = None
    # an unstreamed answer has both (null when not asked for); a chunk only a block
    prompt_logprobs: Prebuilt[PromptLogprobs] = sometimes()
    prompt_token_ids: None = None
    routed_experts: None = sometimes()


class _Answer(BaseModel):
    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


# vLLM's fields of an unstreamed answer that are null here (no service tiers, no KV or
# encoder-cache transfer, no per-request metrics); the fingerprint is fingerprint.py's
Null = Annotated[None, Field(description="vLLM's field; null on this server")]


class CompletionResponse(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    service_tier: Null = None
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None
    kv_transfer_params: Null = None
    ec_transfer_params: Null = None
    metrics: Null = None


class CompletionChunk(_Answer):
    """A streamed completion chunk: a choice's piece, or (no choices) the usage; the
    fingerprint rides on the last chunk (each choice's last, or the usage chunk)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo | None = when_given()
    system_fingerprint: str | None = when_given()


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
    # OpenAI's (and vLLM's reasoning): null, this server has no refusals, tools, audio
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None
    reasoning: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: Prebuilt[ChoiceLogprobs] = None
    finish_reason: str | None = None
    stop_reason: StopReason = None
    token_ids: None = None
    routed_experts: None = None


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    service_tier: Null = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: Prebuilt[PromptLogprobs] = None
    prompt_token_ids: Null = None
    prompt_text: Null = None
    kv_transfer_params: Null = None
    ec_transfer_params: Null = None
    metrics: Null = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = when_given()
    content: str | None = when_given()


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: Prebuilt[ChoiceLogprobs] = None
    finish_reason: str | None = None
    stop_reason: StopReason = sometimes()  # on the chunk with the finish_reason
    token_ids: None = sometimes()  # null on every chunk but the opening one


class ChatCompletionChunk(_Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = when_given()
    system_fingerprint: str | None = when_given()
    # the opening chunk's (null)
    prompt_token_ids: None = sometimes()
    prompt_text: None = sometimes()
