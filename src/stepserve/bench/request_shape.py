"""What one bench request looks like on the wire, as `vllm bench serve` sends it: the
endpoint, the sampling fields (temperature 0.0 unless given), `--extra-body` (merged
last), and the headers (Bearer $OPENAI_API_KEY or `--api-key`, then `--header`, which
win). A completions body carries `prompt` and `max_tokens`; a chat body one user message
and `max_completion_tokens`. Both stream with usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepserve.config.errors import UsageError

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


def sampling_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling flags that were given, as body fields; temperature 0.0 (greedy)
    unless given, as vLLM's bench does."""
    out = {k: values[k] for k in SAMPLING_FIELDS if values.get(k) is not None}
    out.setdefault("temperature", 0.0)
    return out
