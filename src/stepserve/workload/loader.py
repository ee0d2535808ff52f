"""Workloads from YAML (or the equivalent dict) and back, and a trace file as a workload
(`trace_workload`). The YAML shape is docs/guide.md's "Workloads"; a class gives `prompt`
and `output` lengths (lengths.py) or a `sharegpt` file (sharegpt.py), and may add
max_tokens, priority, tenant, length_estimate, shared_prefixes with prefix_len, and
multi_turn (sessions.py). With `arrival: {trace: file.jsonl}` the trace gives every
request, so `classes` is left out and `num_requests` defaults to the trace's length.
Errors carry the YAML path, e.g. `classes[1].output.lognormal.p99 = 10: ...`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stepserve.config.limits import MAX_LEN
from stepserve.config.user_files import load_yaml, preview, write_atomic
from stepserve.config.validate import Allowed
from stepserve.workload.arrivals import TraceReplay, parse_arrival
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_keys,
    check_mapping,
    check_positive,
    located,
    read_user_file,
    resolved,
)
from stepserve.workload.lengths import parse_length
from stepserve.workload.sessions import parse_multi_turn
from stepserve.workload.sharegpt import sharegpt_class
from stepserve.workload.spec import RequestClass, Workload
from stepserve.workload.trace import (
    MAX_SLOWDOWN,
    MOONCAKE_BLOCK_TOKENS,
    TRACE_FORMATS,
    is_mooncake_trace,
    load_mooncake_trace,
    load_trace,
)

TOP_KEYS = ("name", "description", "seed", "num_requests", "duration_s", "arrival", "classes")
CLASS_KEYS = ("name", "share", "prompt", "output", "max_tokens", "priority", "tenant",
              "length_estimate", "sharegpt", "shared_prefixes", "prefix_len", "multi_turn")
# the keys that go to RequestClass as they are (one left out: the field's default)
CLASS_OPTIONS = ("name", "share", "max_tokens", "priority", "tenant", "length_estimate",
                 "shared_prefixes", "prefix_len")
SHAREGPT_KEYS = ("file", "tokenizer", "output_len")


def workload_from_dict(data: Any, base_dir: str | Path | None = None,
                       default_name: str = "custom") -> Workload:
    """Build a workload from its YAML shape; `base_dir` resolves relative file paths."""
    base = Path(base_dir) if base_dir is not None else None
    check_mapping("workload", data)
    check_keys("workload", data, TOP_KEYS, required=("arrival",))
    arrival = parse_arrival(data["arrival"], "arrival", base)
    raw_classes = data.get("classes", [])
    default_count: Any = None
    if isinstance(arrival, TraceReplay):
        default_count = len(arrival.specs)
    else:
        for key in ("num_requests", "classes"):
            if key not in data:
                raise WorkloadError(f"workload: missing required key {key!r} (only a trace "
                                    "arrival may leave it out)")
    if not isinstance(raw_classes, list):
        raise WorkloadError(f"classes = {preview(raw_classes)}: must be a list of request classes")
    classes = tuple(_parse_class(c, f"classes[{i}]", base) for i, c in enumerate(raw_classes))
    return Workload(data.get("name", default_name), classes, arrival,
                    data.get("num_requests", default_count),
                    **{k: data[k] for k in ("seed", "duration_s", "description") if k in data})


def _parse_class(data: Any, where: str, base: Path | None) -> RequestClass:
    """A class of sampled lengths, or one drawing (prompt, output) pairs from a ShareGPT
    file (the file gives both lengths)."""
    check_mapping(where, data)
    dataset = "sharegpt" in data
    check_keys(where, data, CLASS_KEYS,
               required=("name",) if dataset else ("name", "prompt", "output"))
    if dataset:
        for key in ("prompt", "output"):
            if key in data:
                raise WorkloadError(f"{where}: {key!r} and 'sharegpt' exclude each other (the "
                                    "file gives both lengths)")
        raw = data["sharegpt"]
        spec = {"file": raw} if isinstance(raw, str) else raw
        check_mapping(f"{where}.sharegpt", spec)
        check_keys(f"{where}.sharegpt", spec, SHAREGPT_KEYS, required=("file",))
        path = resolved(spec["file"], base)
    else:
        prompt = parse_length(data["prompt"], f"{where}.prompt", base)
        output = parse_length(data["output"], f"{where}.output", base)
    multi_turn = None
    if "multi_turn" in data:
        multi_turn = parse_multi_turn(data["multi_turn"], f"{where}.multi_turn", base)
    options = {"share": 1.0, **{k: data[k] for k in CLASS_OPTIONS if k in data},
               "multi_turn": multi_turn}
    with located(where):
        if dataset:
            return sharegpt_class(path, spec.get("tokenizer"), spec.get("output_len"), **options)
        return RequestClass(prompt=prompt, output=output, **options)


def load_workload(path: str | Path) -> Workload:
    """Read a workload YAML file; relative trace and empirical paths are resolved against
    the file's folder, and the name defaults to the file's stem."""
    p = Path(path)
    data = read_user_file(load_yaml, p, "workload file")
    try:
        return workload_from_dict(data, p.resolve().parent, default_name=p.stem)
    except WorkloadError as e:
        raise WorkloadError(f"workload file {str(p)!r}: {e}") from None


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The YAML shape `workload_from_dict` reads back into an equal workload."""
    out: dict[str, Any] = {"name": workload.name}
    if workload.description:
        out["description"] = workload.description
    out.update(seed=workload.seed, num_requests=workload.num_requests)
    if workload.duration_s is not None:
        out["duration_s"] = workload.duration_s
    out["arrival"] = workload.arrival.to_dict()
    if workload.classes:
        out["classes"] = [_class_to_dict(c) for c in workload.classes]
    return out


def _class_to_dict(c: RequestClass) -> dict[str, Any]:
    """Each field in order, an optional one only when it is not its default."""
    out: dict[str, Any] = {"name": c.name, "share": c.share}
    if c.dataset is not None:
        out["sharegpt"] = {k: v for k, v in c.dataset.items() if k in SHAREGPT_KEYS}
    else:
        out.update(prompt=c.prompt.to_dict(), output=c.output.to_dict())
    for f in dataclasses.fields(c)[4:]:
        value = getattr(c, f.name)
        if f.name in CLASS_OPTIONS and (value != f.default or f.name in ("priority", "tenant")):
            out[f.name] = value
    if c.multi_turn is not None:
        out["multi_turn"] = c.multi_turn.to_dict()
    return out


def save_workload(workload: Workload, path: str | Path) -> Path:
    """Write the workload as YAML (not its requests: use `save_trace` for those)."""
    p = Path(path)
    write_atomic(p, yaml.safe_dump(workload_to_dict(workload), sort_keys=False))
    return p


@dataclass(frozen=True)
class TraceOptions:
    """A JSON Lines trace to replay: `format` auto tells ours from Mooncake's by the first
    line's keys; `slowdown` stretches its times (2: half the rate); `block_tokens` is
    the prompt tokens of one Mooncake hash id."""

    path: str
    format: str = "auto"
    slowdown: float = 1.0
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        """The flags checked as they are given, before the file is opened (its first line
        tells the formats apart)."""
        Allowed(choices=TRACE_FORMATS, kind=str).check("--trace-format", self.format,
                                                       WorkloadError)
        object.__setattr__(self, "slowdown",
                           check_positive("--trace-slowdown", self.slowdown, hi=MAX_SLOWDOWN))
        check_int("--trace-block-tokens", self.block_tokens, lo=1, hi=MAX_LEN)


def trace_workload(options: TraceOptions) -> Workload:
    """The trace as a workload on its own times; the reader's note (an out-of-order
    Mooncake file sorted) printed to stderr."""
    if options.format == "mooncake" or \
            (options.format == "auto" and is_mooncake_trace(options.path)):
        trace = load_mooncake_trace(options.path, options.slowdown, options.block_tokens)
        if trace.note:
            print(f"note: {trace.note}", file=sys.stderr)
        specs, path, description = trace.specs, trace.path, f"Mooncake trace {trace.path}"
    else:
        if options.block_tokens != MOONCAKE_BLOCK_TOKENS:
            raise WorkloadError(f"--trace-block-tokens {options.block_tokens}: goes with a "
                                "Mooncake trace (ours gives no block hashes)")
        specs = tuple(dataclasses.replace(s, arrival_s=s.arrival_s * options.slowdown)
                      for s in load_trace(options.path))
        path, description = str(options.path), f"trace {options.path}"
    return Workload(Path(options.path).stem, (), TraceReplay(specs, path),
                    len(specs), description=description)
