"""One bench request on the wire, as `vllm bench serve` sends it, and what the client saw
of it. Times are seconds on the run's monotonic clock. A chunk time is taken for every SSE
event whose choice carries text or a finish reason, so the last token's time is kept even
when its text is empty; the usage chunk at the end gives the token counts and, where the
server says, the prompt tokens its prefix cache served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepserve.config.errors import UsageError
from stepserve.core.end_reasons import COMPLETED_REASONS

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# vLLM's --backend names for the two OpenAI-compatible request shapes
BACKEND_ENDPOINTS = {"openai": COMPLETIONS, "vllm": COMPLETIONS, "openai-chat": CHAT}
# --flag (dest) -> the body field, in vLLM's order
SAMPLING_FIELDS = ("top_p", "top_k", "min_p", "temperature", "frequency_penalty",
                   "presence_penalty", "repetition_penalty")


@dataclass(frozen=True)
class RequestShape:
    """How every request of a run is sent. `sampling` and `extra_body` are merged into
    the body (extra_body last, as vLLM does); `headers` are sent as given."""

    endpoint: str = COMPLETIONS
    sampling: Mapping[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    served_model_name: str | None = None  # the body's model, when not the target's id

    @property
    def chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")

    def body(self, model: str, prompt: str | list[int], max_tokens: int,
             ignore_eos: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.served_model_name or model}
        if self.chat:
            out["messages"] = [{"role": "user", "content": prompt}]
            out["max_completion_tokens"] = max_tokens
        else:
            out["prompt"] = prompt
            out["max_tokens"] = max_tokens
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
        if ignore_eos:
            out["ignore_eos"] = True
        out.update(self.sampling)
        out.update(self.extra_body)
        return out


def pick_endpoint(backend: str | None, endpoint: str | None) -> str:
    """The endpoint from vLLM's `--backend` and `--endpoint` (either may be left out:
    openai-chat implies the chat endpoint and the chat endpoint openai-chat)."""
    if backend is not None and backend not in BACKEND_ENDPOINTS:
        raise UsageError(f"--backend {backend!r}: not one of {', '.join(BACKEND_ENDPOINTS)}")
    if endpoint is None:
        return BACKEND_ENDPOINTS[backend or "openai"]
    if not endpoint.startswith("/") or not endpoint.rstrip("/").endswith("completions"):
        raise UsageError(f"--endpoint {endpoint!r}: expected {COMPLETIONS} or {CHAT}")
    chat = endpoint.rstrip("/").endswith("chat/completions")
    if backend is not None and chat != (BACKEND_ENDPOINTS[backend] == CHAT):
        raise UsageError(f"--backend {backend} sends to {BACKEND_ENDPOINTS[backend]}, not "
                         f"--endpoint {endpoint}")
    return endpoint


def key_values(flag: str, items: Iterable[str] | None) -> dict[str, str]:
    """`KEY=VALUE` strings as a dict (later keys win); UsageError naming the bad one."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def request_headers(api_key: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    """Bearer `api_key` (when given), then the `--header` values on top."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    headers.update(extra)
    return headers


def sampling_fields(values: Mapping[str, Any], greedy: bool = True) -> dict[str, Any]:
    """The sampling flags that were given, as body fields. `greedy`: temperature 0.0
    unless given (our workload files and scenarios); else none is sent and the server's
    default applies, as vLLM 0.32's bench does with its dataset flags."""
    out = {k: values[k] for k in SAMPLING_FIELDS if values.get(k) is not None}
    if greedy:
        out.setdefault("temperature", 0.0)
    return out


def vllm_defaults_note(sampling: Mapping[str, Any], dataset: str | None,
                       ignore_eos: bool) -> str | None:
    """What a load built from vLLM's dataset flags leaves to the server, in one line
    (None when nothing is left)."""
    if dataset is None or "temperature" in sampling:
        return None
    eos = "EOS ignored (random lengths)" if ignore_eos else "EOS honoured"
    return (f"note: as vLLM 0.32's bench, no temperature is sent (the server's default "
            f"applies) and {eos}; add --temperature 0 --ignore-eos for the greedy, "
            f"full-length load older benches sent")


@dataclass
class RequestRecord:
    """What the client saw of one request. `ok` iff it ended with stop or length."""

    index: int
    request_class: str = "default"
    prompt_len: int = 0
    max_tokens: int = 0
    warmup: bool = False
    scheduled_s: float = 0.0  # when the arrival process wanted it sent
    send_s: float | None = None  # None: never sent
    end_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    output_tokens: int | None = None  # from the usage chunk; None if none came
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # from usage's prompt_tokens_details; None if absent
    repeated_tokens: int | None = None  # of its prompt, an earlier prompt's prefix (loadgen)
    finish_reason: str | None = None
    status: int | None = None  # HTTP status; None: no response (connection failure)
    error: str | None = None
    generated_text: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason in COMPLETED_REASONS

    @property
    def num_output_tokens(self) -> int:
        """Usage's count, else one per chunk that carried a choice."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_times_s)

    @property
    def outcome(self) -> str:
        """ok, http_<status>, or the kind of failure (for counting errors)."""
        if self.ok:
            return "ok"
        if self.send_s is None:
            return "not_sent"
        if self.status is not None and self.status != 200:
            return f"http_{self.status}"
        if self.error and self.error.startswith("interrupted"):
            return "interrupted"
        if self.status is None:
            return "connection_error"
        return "stream_error"


def _error_text(raw: bytes) -> str:
    try:
        err = json.loads(raw)["error"]
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:200]


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                            record: RequestRecord, t0: float) -> RequestRecord:
    """POST `body` to `url` and fill `record`; never raises for HTTP or stream failures
    (they land in record.status / record.error). Cancellation propagates."""
    record.send_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", url, json=body) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                record.error = f"HTTP {resp.status_code}: {_error_text(await resp.aread())}"
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                _take_event(record, data, now)
            if record.error is None and record.finish_reason is None:
                record.error = "the stream ended without a finish reason"
    except httpx.HTTPError as e:
        record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    finally:
        record.end_s = time.perf_counter() - t0
    return record


def _take_event(record: RequestRecord, data: str, now: float) -> None:
    try:
        event = json.loads(data)
    except ValueError:
        record.error = f"bad SSE data: {data[:80]!r}"
        return
    if "error" in event:
        err = event["error"]
        record.error = "stream error: " + (str(err.get("message", err))
                                           if isinstance(err, dict) else str(err))
        return
    usage = event.get("usage")
    if usage:
        record.output_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
        record.cached_tokens = _cached_tokens(usage)
    choices = event.get("choices") or []
    if not choices:
        return
    choice = choices[0]
    text = _choice_text(choice)
    if text or choice.get("finish_reason"):
        record.chunk_times_s.append(now)
        record.generated_text += text
    if choice.get("finish_reason"):
        record.finish_reason = choice["finish_reason"]


def _cached_tokens(usage: Any) -> int | None:
    """usage.prompt_tokens_details.cached_tokens when the server reports a count."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _choice_text(choice: dict[str, Any]) -> str:
    """A completions choice's text, or a chat delta's content (or reasoning content)."""
    if "text" in choice:
        return choice["text"] if isinstance(choice["text"], str) else ""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    text = delta.get("content") or delta.get("reasoning_content")
    return text if isinstance(text, str) else ""
