"""An in-process request (`bench --engine`, `--sim`) is recorded as an HTTP client would
have seen it: the status end_reasons.py gives its end while no token was out (a full
queue a 429, a queue timeout a 503), a 200 with an error in the stream after one was."""

from __future__ import annotations

import pytest

from stepserve.bench.inprocess import record_of
from stepserve.core.end_reasons import (
    FINISH_REASON_OF,
    RejectReason,
    RequestStatus,
    end_reason,
)
from stepserve.core.request import Request, SamplingParams


def _ended(status: RequestStatus, tokens: int = 0,
           reject: RejectReason | None = None) -> Request:
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=4), arrival_time=0.0)
    req.output_token_ids = list(range(tokens))
    req.token_times = [0.1 * (i + 1) for i in range(tokens)]
    req.status, req.finish_reason, req.reject_reason = status, FINISH_REASON_OF[status], reject
    req.finish_time = 1.0
    return req


@pytest.mark.parametrize("status,reject,outcome", [
    (RequestStatus.FINISHED_REJECTED, RejectReason.QUEUE_FULL, "http_429"),
    (RequestStatus.FINISHED_REJECTED, RejectReason.TOO_LONG, "http_400"),
    (RequestStatus.FINISHED_TIMED_OUT, None, "http_503"),
    (RequestStatus.FINISHED_ABORTED, None, "http_503"),
    (RequestStatus.FINISHED_ERROR, None, "http_500"),
])
def test_an_end_before_any_token_is_the_tables_status(status, reject, outcome):
    rec = record_of(_ended(status, reject=reject), 0, False, 0.0, 0.0)
    assert rec.outcome == outcome and not rec.ok
    assert rec.status == end_reason(reject or FINISH_REASON_OF[status]).http_status


def test_an_end_after_tokens_is_a_stream_error_and_a_completed_one_ok():
    aborted = record_of(_ended(RequestStatus.FINISHED_ABORTED, tokens=2), 0, False, 0.0, 0.0)
    assert (aborted.status, aborted.outcome) == (200, "stream_error")
    done = record_of(_ended(RequestStatus.FINISHED_LENGTH, tokens=4), 0, False, 0.0, 0.0)
    assert (done.status, done.outcome, done.error) == (200, "ok", None)


def test_a_live_request_has_no_status():
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=4), arrival_time=0.0)
    assert record_of(req, 0, False, 0.0, 0.0).status is None
