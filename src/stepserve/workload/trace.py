"""Request traces as JSON Lines: one request per line, so a trace can be streamed, grepped
and cut with `head`.

    {"arrival_s": 0.0, "prompt_len": 312, "output_len": 87, "max_tokens": 87,
     "priority": 0, "tenant": "a", "class": "chat"}

`arrival_s`, `prompt_len` and `output_len` are required; `max_tokens` defaults to
`output_len`, `priority` to 0, `tenant` and `class` to "default", `length_estimate` to none.
A trace holds at most limits.MAX_NUM_REQUESTS requests, arriving within MAX_SECONDS.
`save_trace` writes every field, and `load_trace` reads back the identical list.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_NUM_REQUESTS, MAX_SECONDS
from stepserve.config.user_files import preview, read_text, write_atomic
from stepserve.workload.errors import WorkloadError, check_positive
from stepserve.workload.request_spec import RequestSpec

REQUIRED = ("arrival_s", "prompt_len", "output_len")
OPTIONAL = ("max_tokens", "priority", "tenant", "class", "length_estimate")


def spec_to_record(spec: RequestSpec) -> dict[str, Any]:
    """One trace line's content (the index is the line's place, not a field)."""
    record: dict[str, Any] = {
        "arrival_s": spec.arrival_s,
        "prompt_len": spec.prompt_len,
        "output_len": spec.output_len,
        "max_tokens": spec.max_tokens,
        "priority": spec.priority,
        "tenant": spec.tenant,
        "class": spec.request_class,
    }
    if spec.length_estimate is not None:
        record["length_estimate"] = spec.length_estimate
    return record


def record_to_spec(record: Any, index: int) -> RequestSpec:
    """A spec from one decoded line; raises WorkloadError naming the bad field."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{preview(record)}: must be a JSON object with keys "
                            f"{', '.join(REQUIRED + OPTIONAL)}")
    for key in record:
        if key not in REQUIRED + OPTIONAL:
            raise WorkloadError(f"unknown key {preview(key)}; allowed keys: "
                                f"{', '.join(REQUIRED + OPTIONAL)}")
    for key in REQUIRED:
        if key not in record:
            raise WorkloadError(f"missing required key {preview(key)}")
    output_len = record["output_len"]
    check_positive("arrival_s", record["arrival_s"], allow_zero=True, hi=MAX_SECONDS)
    return RequestSpec(
        index=index,
        arrival_s=record["arrival_s"],
        prompt_len=record["prompt_len"],
        output_len=output_len,
        max_tokens=record.get("max_tokens", output_len),
        priority=record.get("priority", 0),
        tenant=record.get("tenant", "default"),
        request_class=record.get("class", "default"),
        length_estimate=record.get("length_estimate"),
    )


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, Any]]:
    """The decoded records of a JSON Lines file of requests (`what`: "trace"), blank lines
    skipped, each with where it stands (`trace 'path' line N`) for an error about it; at
    most MAX_NUM_REQUESTS. WorkloadError for a file that cannot be read, a line that is
    not JSON, too many requests or none."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    try:
        text = read_text(p, what)
    except UsageError as e:
        raise WorkloadError(str(e)) from None
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if count == MAX_NUM_REQUESTS:
            raise WorkloadError(f"{where}: more than {MAX_NUM_REQUESTS:,} requests (the "
                                "most a workload may have)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where} line {number}: not valid JSON ({e.msg} at column "
                                f"{e.colno})") from None
        except (RecursionError, ValueError) as e:  # nested too deeply; a huge number
            raise WorkloadError(f"{where} line {number}: not valid JSON "
                                f"({type(e).__name__}: {e})") from None
        count += 1
        yield f"{where} line {number}", record
    if not count:
        raise WorkloadError(f"{where}: holds no requests")


def load_trace(path: str | Path) -> list[RequestSpec]:
    """Read a JSONL trace. Blank lines are skipped; requests are sorted (stably) by
    arrival and re-indexed 0..n-1. Errors name the file and the line number."""
    specs = []
    for at, record in list(read_jsonl(path, "trace")):  # every line JSON before any check
        try:
            specs.append(record_to_spec(record, 0))
        except WorkloadError as e:
            raise WorkloadError(f"{at}: {e}") from None
    specs.sort(key=lambda s: s.arrival_s)
    return [dataclasses.replace(s, index=i) for i, s in enumerate(specs)]


def save_trace(specs: Iterable[RequestSpec], path: str | Path) -> Path:
    """Write specs as JSONL (in the order given; `load_trace` sorts by arrival)."""
    p = Path(path)
    lines = [json.dumps(spec_to_record(s)) for s in specs]
    write_atomic(p, "".join(line + "\n" for line in lines))
    return p
