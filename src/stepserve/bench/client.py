"""One streamed request to an OpenAI-compatible `/v1/completions` or
`/v1/chat/completions`, recorded.

Times are seconds on the run's monotonic clock. A chunk time is taken for every SSE event
whose choice carries text (chat: content or reasoning content) or a finish reason, so the
last token's time is kept even when its text is empty; the usage chunk at the end gives
the token counts and, where the server says, the prompt tokens its prefix cache served.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepserve.core.end_reasons import COMPLETED_REASONS


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
        return self.output_tokens if self.output_tokens is not None \
            else len(self.chunk_times_s)

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
