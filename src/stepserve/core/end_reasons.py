"""How a request ends, one table: each way (finished, aborted, timed out, failed, refused
by admission (`RejectReason`) or by the server (`Refusal`)) is a row of `END_REASONS`
naming what the client sees (`finish_reason`, or the HTTP status and OpenAI error type
and code) and the Prometheus counter and label. Nothing else maps end reasons to
statuses, codes or labels. After a stream began, an abnormal end arrives as an event.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestStatus(enum.IntEnum):
    """Ordered: every finished state compares greater than every live one."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # KV dropped (recompute); waiting to be re-prefilled
    SWAPPED = 3  # KV in the CPU pool; waiting to be swapped back in
    FINISHED_STOPPED = 10
    FINISHED_LENGTH = 11
    FINISHED_ABORTED = 12
    FINISHED_REJECTED = 13
    FINISHED_TIMED_OUT = 14
    FINISHED_ERROR = 15  # a fault while running its step; its blocks were freed

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


class FinishReason(str, enum.Enum):
    """The engine's end of a request (vLLM's stop, length and abort, and stepserve's)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    ERROR = "error"

    @property
    def completed(self) -> bool:
        """Stop or length: a completed request (the one definition)."""
        return self.value in COMPLETED_REASONS


class RejectReason(str, enum.Enum):
    """Why admission refused a request (FinishReason.REJECTED)."""

    EMPTY_PROMPT = "empty_prompt"
    TOO_LONG = "too_long"  # prompt + max_tokens over max_model_len
    QUEUE_FULL = "queue_full"  # max_waiting reached: retry later


class Refusal(str, enum.Enum):
    """Why the server refused a request before any engine held it."""

    INVALID = "invalid"  # a client's mistake in the request (any 4xx but the listed ones)
    UNKNOWN_MODEL = "unknown_model"
    SHUTTING_DOWN = "shutting_down"
    ENGINE_DOWN = "engine_down"  # the engine loop died; the process is exiting
    FAILED = "failed"  # the engine could not take it, by a fault of its own


# OpenAI's error types
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"

# the two Prometheus counters a request's end is counted in (under `stepserve:`)
SUCCESS = "request_success"  # label finished_reason: every request the engine ended
REJECTED = "request_rejected"  # label reason: every refusal


@dataclass(frozen=True, slots=True)
class EndReason:
    """One way a request ends: answered (200) with `finish_reason`, or an error answer
    of `error_type` and `error_code` with `message` around the detail; counted in
    `counter` under `label` (None: uncounted)."""

    key: FinishReason | RejectReason | Refusal
    finish_reason: FinishReason | None  # on the engine's Request (None: never held)
    engine_status: RequestStatus | None  # the engine's end state (None: never held)
    http_status: int
    error_type: str | None
    error_code: str | None
    counter: str | None
    label: str | None
    message: str = "{}"
    retry_after: bool = False  # the answer carries Retry-After: the client should retry
    # how vLLM's series name it: its finished_reason, or its admission_rejections reason
    vllm_label: str | None = None

    @property
    def completed(self) -> bool:
        return self.http_status == 200

    def describe(self, detail: str) -> str:
        return self.message.format(detail)


_F, _S = FinishReason, RequestStatus


def _refused(key: RejectReason | Refusal, status: int, error_type: str, code: str,
             counted: bool = True, message: str = "{}", *,
             retry_after: bool = False, vllm: str | None = None) -> EndReason:
    by_engine = isinstance(key, RejectReason)
    return EndReason(key, _F.REJECTED if by_engine else None,
                     _S.FINISHED_REJECTED if by_engine else None, status, error_type, code,
                     REJECTED if counted else None, key.value if counted else None,
                     message, retry_after, vllm)


def _ended(key: FinishReason, status: RequestStatus, http_status: int = 200,
           error_type: str | None = None, code: str | None = None,
           message: str = "{}", vllm: str | None = None) -> EndReason:
    return EndReason(key, key, status, http_status, error_type, code, SUCCESS, key.value,
                     message, vllm_label=vllm or key.value)


END_REASONS: tuple[EndReason, ...] = (
    _ended(_F.STOP, _S.FINISHED_STOPPED),
    _ended(_F.LENGTH, _S.FINISHED_LENGTH),
    _ended(_F.ABORT, _S.FINISHED_ABORTED, 503, UNAVAILABLE, "aborted",
           "request aborted: {}"),
    # vLLM has no queue timeout: the server ended the request before it ran out, its abort
    _ended(_F.TIMED_OUT, _S.FINISHED_TIMED_OUT, 503, UNAVAILABLE, "queue_timeout",
           "the server is overloaded: the request {}; retry later", vllm="abort"),
    _ended(_F.ERROR, _S.FINISHED_ERROR, 500, SERVER_ERROR, "engine_error",
           "internal error: {}"),
    # the max_waiting cap is vLLM's max_num_queued_reqs
    _refused(RejectReason.QUEUE_FULL, 429, RATE_LIMIT, "queue_full",
             message="the server is overloaded: {}", retry_after=True,
             vllm="max_num_queued_reqs"),
    _refused(RejectReason.TOO_LONG, 400, INVALID_REQUEST, "context_length_exceeded"),
    _refused(RejectReason.EMPTY_PROMPT, 400, INVALID_REQUEST, "empty_prompt"),
    _refused(Refusal.INVALID, 400, INVALID_REQUEST, "invalid_value"),
    # OpenAI's answer to an unknown model: 404, yet an invalid request (not not_found)
    _refused(Refusal.UNKNOWN_MODEL, 404, INVALID_REQUEST, "model_not_found"),
    _refused(Refusal.SHUTTING_DOWN, 503, UNAVAILABLE, "shutting_down",
             message="the server cannot take requests: {}"),
    # uncounted: the process exits and takes its counters with it
    _refused(Refusal.ENGINE_DOWN, 503, UNAVAILABLE, "engine_down", counted=False,
             message="the server cannot take requests: {}"),
    _refused(Refusal.FAILED, 500, SERVER_ERROR, "engine_error", counted=False,
             message="internal error: the engine could not take the request: {}"),
)

_BY_KEY: dict[str, EndReason] = {row.key.value: row for row in END_REASONS}
# a refusal's counter row by its error code (its codes are unique among counted ones)
_COUNTED_BY_CODE: dict[str, EndReason] = {row.error_code: row for row in END_REASONS
                                          if row.counter == REJECTED and row.error_code}

# derived views of the table, for the engine and for the pre-created counter children
FINISH_REASON_OF: dict[RequestStatus, FinishReason] = {
    row.engine_status: row.finish_reason for row in END_REASONS
    if row.engine_status is not None and row.finish_reason is not None}
COMPLETED_REASONS: tuple[str, ...] = tuple(row.key.value for row in END_REASONS
                                           if row.completed)
SUCCESS_LABELS: tuple[str, ...] = tuple(row.label for row in END_REASONS
                                        if row.counter == SUCCESS and row.label)
REJECTED_LABELS: tuple[str, ...] = tuple(row.label for row in END_REASONS
                                         if row.counter == REJECTED and row.label)

# vLLM's names, for its series (server/vllm_metrics.py): its finish reasons in its order
# (repetition, its repeated-output detector, we have none of: it stays 0) and its
# admission limits (no cap on queued tokens here: None); ours by the vLLM name of each
VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
AS_VLLM_FINISHED: dict[str, str] = {row.label: row.vllm_label for row in END_REASONS
                                    if row.counter == SUCCESS and row.label and row.vllm_label}
VLLM_ADMISSION_REASONS: dict[str, str | None] = {
    "max_num_queued_reqs": None, "max_num_queued_tokens": None,
    **{row.vllm_label: row.label for row in END_REASONS
       if row.counter == REJECTED and row.vllm_label}}
if not set(AS_VLLM_FINISHED.values()) <= set(VLLM_FINISHED_REASONS):
    raise AssertionError(f"finish reasons without a vLLM name: {AS_VLLM_FINISHED}")


def end_reason(key: str | None) -> EndReason:
    """The row of a finish reason, reject reason or refusal (enum or string); None: an
    error end; a reason this table does not know: an invalid request."""
    if key is None:
        return _BY_KEY[FinishReason.ERROR.value]
    value = key.value if isinstance(key, enum.Enum) else key
    return _BY_KEY.get(value, _BY_KEY[Refusal.INVALID.value])


def end_of(finish_reason: str | None, reject_reason: str | None = None) -> EndReason:
    """The row of an ended request: its finish reason, or its reject reason."""
    value = finish_reason.value if isinstance(finish_reason, enum.Enum) else finish_reason
    if value == FinishReason.REJECTED.value:
        return end_reason(reject_reason or Refusal.INVALID)
    return end_reason(value)


def refusal_of_error(http_status: int, error_code: str | None) -> EndReason | None:
    """The counted refusal an error answer is, by its code (another 4xx but 404: an
    invalid request); None: not a refusal."""
    row = _COUNTED_BY_CODE.get(error_code or "")
    if row is None and 400 <= http_status < 500 and http_status != 404:
        row = _BY_KEY[Refusal.INVALID.value]
    return row
