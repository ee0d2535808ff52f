"""Request traces as JSON Lines: one request per line, so a trace can be streamed, grepped
and cut with `head`.

    {"arrival_s": 0.0, "prompt_len": 312, "output_len": 87, "max_tokens": 87,
     "priority": 0, "tenant": "a", "class": "chat"}

`arrival_s`, `prompt_len` and `output_len` are required; `max_tokens` defaults to
`output_len`, the rest to RequestSpec's defaults. At most limits.MAX_NUM_REQUESTS
requests, arriving within MAX_SECONDS; `load_trace` reads back what `save_trace` wrote.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stepserve.config.limits import MAX_NUM_REQUESTS, MAX_SECONDS
from stepserve.config.user_files import preview, read_text, write_atomic
from stepserve.workload.errors import WorkloadError, check_positive, read_user_file
from stepserve.workload.request_spec import RequestSpec

# a line's keys -> the RequestSpec fields they fill (the index is the line's place)
FIELDS = {"arrival_s": "arrival_s", "prompt_len": "prompt_len", "output_len": "output_len",
          "max_tokens": "max_tokens", "priority": "priority", "tenant": "tenant",
          "class": "request_class", "length_estimate": "length_estimate"}
REQUIRED = ("arrival_s", "prompt_len", "output_len")


def spec_to_record(spec: RequestSpec) -> dict[str, Any]:
    record = {key: getattr(spec, attr) for key, attr in FIELDS.items()}
    if spec.length_estimate is None:
        del record["length_estimate"]
    return record


def record_to_spec(record: Any, index: int) -> RequestSpec:
    """A spec from one decoded line; raises WorkloadError naming the bad field."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{preview(record)}: must be a JSON object with keys "
                            f"{', '.join(FIELDS)}")
    for key in record:
        if key not in FIELDS:
            raise WorkloadError(f"unknown key {preview(key)}; allowed keys: {', '.join(FIELDS)}")
    for key in REQUIRED:
        if key not in record:
            raise WorkloadError(f"missing required key {preview(key)}")
    check_positive("arrival_s", record["arrival_s"], allow_zero=True, hi=MAX_SECONDS)
    fields = {attr: record[key] for key, attr in FIELDS.items() if key in record}
    return RequestSpec(index=index, **{"max_tokens": record["output_len"], **fields})


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, Any]]:
    """The decoded records of a JSON Lines file of requests (`what`: "trace"), blank lines
    skipped, each with where it stands (`trace 'path' line N`) for an error about it; at
    most MAX_NUM_REQUESTS. WorkloadError for a file that cannot be read, a line that is
    not JSON, too many requests or none."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    text = read_user_file(read_text, p, what)
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
