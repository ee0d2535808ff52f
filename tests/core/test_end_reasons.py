"""The one table of how requests end (core/end_reasons.py): one row per way of ending,
consistent columns, and no other mapping of end reasons anywhere in the source. The
server's answers are checked against the table through a real server in
tests/server (test_overload, test_bad_inputs, test_fault_isolation, test_metrics_vllm)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from stepserve.core.end_reasons import (
    COMPLETED_REASONS,
    END_REASONS,
    FINISH_REASON_OF,
    REJECTED,
    SUCCESS,
    FinishReason,
    Refusal,
    RejectReason,
    RequestStatus,
    end_of,
    end_reason,
    refusal_of_error,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "stepserve"
TABLE = SRC / "core" / "end_reasons.py"


def test_every_engine_end_state_has_exactly_one_row():
    ends = [s for s in RequestStatus if s.is_finished]
    rows = Counter(r.engine_status for r in END_REASONS if r.engine_status is not None)
    for status in ends:
        want = len(RejectReason) if status is RequestStatus.FINISHED_REJECTED else 1
        assert rows[status] == want, status
    assert set(rows) == set(ends)
    assert set(FINISH_REASON_OF) == set(ends)


def test_every_reason_has_exactly_one_row():
    keys = Counter(r.key for r in END_REASONS)
    every = [*(f for f in FinishReason if f is not FinishReason.REJECTED), *RejectReason,
             *Refusal]
    assert keys == Counter(every)
    for key in every:
        assert end_reason(key).key is key and end_reason(key.value).key is key


@pytest.mark.parametrize("row", END_REASONS, ids=lambda r: r.key.value)
def test_columns_agree(row):
    if row.completed:
        assert (row.error_type, row.error_code) == (None, None)
    else:
        assert row.http_status >= 400 and row.error_type and row.error_code
        assert row.describe("DETAIL").count("DETAIL") == 1
    if row.counter == SUCCESS:  # vLLM's request_success{finished_reason}
        assert row.finish_reason is not None and row.label == row.finish_reason.value
    elif row.counter == REJECTED:
        assert row.label == row.key.value
    else:
        assert row.counter is None and row.label is None
    if row.finish_reason is not None:
        assert FINISH_REASON_OF[row.engine_status] is row.finish_reason
    assert row.retry_after == (row.http_status == 429)


def test_completed_is_stop_or_length():
    assert set(COMPLETED_REASONS) == {"stop", "length"}
    assert [f for f in FinishReason if f.completed] == [FinishReason.STOP,
                                                         FinishReason.LENGTH]


def test_lookups():
    assert end_of(None).key is FinishReason.ERROR  # nothing said how it ended
    assert end_of("rejected", "queue_full").http_status == 429
    assert end_of(FinishReason.REJECTED, None).key is Refusal.INVALID
    assert end_reason("no_such_reason").key is Refusal.INVALID
    assert refusal_of_error(429, "queue_full").key is RejectReason.QUEUE_FULL
    assert refusal_of_error(400, "context_length_exceeded").key is RejectReason.TOO_LONG
    assert refusal_of_error(413, "body_too_large").key is Refusal.INVALID
    assert refusal_of_error(404, "model_not_found").key is Refusal.UNKNOWN_MODEL
    assert refusal_of_error(404, "not_found") is None  # an unknown route
    assert refusal_of_error(503, "queue_timeout") is None  # an end, not a refusal
    assert refusal_of_error(500, "engine_error") is None


# ---- nothing else maps end reasons ----

# every name the table gives an end: its reasons, labels and error codes
NAMES = frozenset({r.key.value for r in END_REASONS} | {f.value for f in FinishReason}
                  | {r.error_code for r in END_REASONS if r.error_code})


def _names_in(node: ast.AST) -> set[str]:
    """The end names a literal container holds anywhere inside: as strings, or as enum
    members (`FinishReason.STOP`, `RejectReason.QUEUE_FULL`, `RequestStatus.FINISHED_
    ABORTED` name "aborted"... by their lower-cased member name)."""
    if not isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
        return set()
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
        elif (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
              and sub.attr.isupper()):
            found.add(sub.attr.lower().removeprefix("finished_"))
    return found & NAMES


def _dispatches_on_reason(node: ast.AST) -> bool:
    """`x.finish_reason == "abort"`, `reason in (...)`: a decision on an end reason's
    string, which the table's row should make."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    named = any("reason" in ast.unparse(s).lower() for s in sides
                if not isinstance(s, ast.Constant))
    return named and any(isinstance(s, ast.Constant) and s.value in NAMES for s in sides)


def end_reason_tables(root: Path = SRC) -> dict[str, list[str]]:
    """{file: the lines where it maps end reasons}: a literal holding two or more end
    names (a dict of reasons, a tuple of finish reasons) or a comparison of a reason with
    one."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if len(_names_in(node)) >= 2 or _dispatches_on_reason(node):
                found.setdefault(str(path.relative_to(root)), []).append(
                    f"{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_table_is_the_only_mapping_of_end_reasons():
    found = end_reason_tables()
    table = str(TABLE.relative_to(SRC))
    assert table in found  # the rule sees the table itself
    assert {f: lines for f, lines in found.items() if f != table} == {}


def test_the_rule_catches_the_old_mappings(tmp_path):
    (tmp_path / "old.py").write_text(
        'CODES = {"queue_full": "queue_full", "model_not_found": "unknown_model"}\n'
        'FINISH = ("stop", "length", "abort")\n'
        'def f(out):\n    return out.finish_reason == "timed_out"\n'
        'ok = {"error": {"message": "m"}}\n')  # an error body is no mapping
    assert [line.split(":")[0] for line in end_reason_tables(tmp_path)["old.py"]] == \
        ["1", "2", "4"]
