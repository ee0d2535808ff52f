"""Workloads from YAML (or the equivalent dict) and back, plus JSONL traces (trace.py).

    name: mixed
    seed: 1
    num_requests: 2000
    duration_s: 600                         # optional: drop open-loop arrivals after this
    arrival: {poisson: {rate: 5.0}}         # gamma, constant, closed_loop, trace: see arrivals
    classes:
      - {name: summary, share: 0.3, prompt: {fixed: 8192}, output: {fixed: 200}}
      - name: chat
        share: 0.7
        prompt: {lognormal: {p50: 300, p99: 900}}
        output: {uniform: [50, 400]}
        max_tokens: 1024                    # optional client cap (default: the output length)
        priority: 0                         # optional, lower is more urgent
        tenant: a                           # optional
        length_estimate: none               # optional: none, exact, class_mean
        shared_prefixes: 32                 # optional, with prefix_len: each prompt opens
        prefix_len: 512                     # with one of 32 system prompts of 512 tokens
        multi_turn: {turns: 4, think_time_s: 5}   # optional: each arrival opens a
                                            # conversation of 4 turns (sessions.py)
      - name: real                          # lengths from a ShareGPT-style JSON file:
        sharegpt: {file: sg.json, tokenizer: default}   # (prompt, output) pairs, see
                                            # sharegpt.py; tokenizer, output_len optional

With `arrival: {trace: file.jsonl}` the trace gives every request, so `classes` must be
left out and `num_requests` defaults to the trace's length.

The YAML shapes of length distributions and arrival processes:

Lengths (`parse_length`):

    {fixed: 20}  (or just 20)
    {uniform: [10, 50]}                        # integers, both ends included
    {lognormal: {p50: 20, p99: 2000, max: 4096}}
    {mixture: [{weight: 0.85, fixed: 20}, {weight: 0.15, fixed: 2000}]}
    {empirical: [1, 2, 3]}  or  {empirical: {file: lengths.txt}}

Arrivals (`parse_arrival`):

    {poisson: {rate: 5.0}}
    {gamma: {rate: 5.0, burstiness: 0.5}}
    {constant: {rate: 2.0}}
    {closed_loop: {concurrency: 64}}          # `batch:` is accepted as another name
    {trace: requests.jsonl}  or  {trace: {path: requests.jsonl, concurrency: 64}}
    {rounds: ...}, {rate_schedule: ...}       # workload/arrival_shapes.py

`to_dict()` on every distribution and process writes these shapes back. Errors carry the
YAML path given as `where`, e.g. `classes[1].output.lognormal.p99 = 10: ...`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_CONCURRENCY
from stepserve.config.user_files import load_yaml, preview, write_atomic
from stepserve.workload.arrival_shapes import SHAPES
from stepserve.workload.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    TraceReplay,
    trace_replay,
)
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_keys,
    check_mapping,
    check_str,
    one_key,
    prefixed,
)
from stepserve.workload.lengths import Empirical, Fixed, LengthDist, LogNormal, Mixture, Uniform
from stepserve.workload.sessions import MultiTurn, parse_multi_turn
from stepserve.workload.spec import RequestClass, Workload
from stepserve.workload.trace import load_trace, save_trace

__all__ = ["load_workload", "workload_from_dict", "workload_to_dict", "save_workload",
           "load_trace", "save_trace", "parse_length", "parse_arrival"]

TOP_KEYS = ("name", "description", "seed", "num_requests", "duration_s", "arrival", "classes")
CLASS_KEYS = ("name", "share", "prompt", "output", "max_tokens", "priority", "tenant",
              "length_estimate", "sharegpt", "shared_prefixes", "prefix_len", "multi_turn")
SHAREGPT_KEYS = ("file", "tokenizer", "output_len")


def _resolved(path: str, base_dir: Path | None) -> Path:
    """A file named in a workload: a relative path is the workload file's folder's."""
    p = Path(path)
    return base_dir / p if base_dir is not None and not p.is_absolute() else p


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
    return Workload(
        name=data.get("name", default_name),
        classes=classes,
        arrival=arrival,
        num_requests=data.get("num_requests", default_count),
        seed=data.get("seed", 0),
        duration_s=data.get("duration_s"),
        description=data.get("description", ""),
    )


def _parse_sharegpt_class(data: dict, where: str, base: Path | None) -> RequestClass:
    from stepserve.workload.sharegpt import sharegpt_class

    for key in ("prompt", "output"):
        if key in data:
            raise WorkloadError(f"{where}: {key!r} and 'sharegpt' exclude each other (the "
                                "file gives both lengths)")
    raw = data["sharegpt"]
    spec = {"file": raw} if isinstance(raw, str) else raw
    check_mapping(f"{where}.sharegpt", spec)
    check_keys(f"{where}.sharegpt", spec, SHAREGPT_KEYS, required=("file",))
    path = _resolved(spec["file"], base)
    multi_turn = _multi_turn(data, where, base)
    try:
        cls = sharegpt_class(
            path, spec.get("tokenizer"), spec.get("output_len"), name=data["name"],
            share=data.get("share", 1.0), max_tokens=data.get("max_tokens"),
            priority=data.get("priority", 0), tenant=data.get("tenant", "default"),
            length_estimate=data.get("length_estimate", "none"),
            shared_prefixes=data.get("shared_prefixes", 0), prefix_len=data.get("prefix_len", 0))
        return dataclasses.replace(cls, multi_turn=multi_turn) if multi_turn else cls
    except WorkloadError as e:
        raise prefixed(where, e) from None


def _multi_turn(data: dict, where: str, base: Path | None) -> MultiTurn | None:
    if "multi_turn" not in data:
        return None
    return parse_multi_turn(data["multi_turn"], f"{where}.multi_turn", base)


def _parse_class(data: Any, where: str, base: Path | None) -> RequestClass:
    check_mapping(where, data)
    if "sharegpt" in data:
        check_keys(where, data, CLASS_KEYS, required=("name",))
        return _parse_sharegpt_class(data, where, base)
    check_keys(where, data, CLASS_KEYS, required=("name", "prompt", "output"))
    prompt = parse_length(data["prompt"], f"{where}.prompt", base)
    output = parse_length(data["output"], f"{where}.output", base)
    multi_turn = _multi_turn(data, where, base)
    try:
        return RequestClass(
            name=data["name"],
            share=data.get("share", 1.0),
            prompt=prompt,
            output=output,
            max_tokens=data.get("max_tokens"),
            priority=data.get("priority", 0),
            tenant=data.get("tenant", "default"),
            length_estimate=data.get("length_estimate", "none"),
            shared_prefixes=data.get("shared_prefixes", 0),
            prefix_len=data.get("prefix_len", 0),
            multi_turn=multi_turn,
        )
    except WorkloadError as e:
        raise prefixed(where, e) from None


def load_workload(path: str | Path) -> Workload:
    """Read a workload YAML file; relative trace and empirical paths are resolved against
    the file's folder, and the name defaults to the file's stem."""
    p = Path(path)
    try:
        data = load_yaml(p, "workload file")
    except UsageError as e:
        raise WorkloadError(str(e)) from None
    try:
        return workload_from_dict(data, p.resolve().parent, default_name=p.stem)
    except WorkloadError as e:
        raise WorkloadError(f"workload file {str(p)!r}: {e}") from None


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The YAML shape `workload_from_dict` reads back into an equal workload."""
    out: dict[str, Any] = {"name": workload.name}
    if workload.description:
        out["description"] = workload.description
    out["seed"] = workload.seed
    out["num_requests"] = workload.num_requests
    if workload.duration_s is not None:
        out["duration_s"] = workload.duration_s
    out["arrival"] = workload.arrival.to_dict()
    if workload.classes:
        out["classes"] = [_class_to_dict(c) for c in workload.classes]
    return out


def _class_to_dict(c: RequestClass) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "share": c.share}
    if c.dataset is not None:
        out["sharegpt"] = {k: v for k, v in c.dataset.items() if k in SHAREGPT_KEYS}
    else:
        out.update(prompt=c.prompt.to_dict(), output=c.output.to_dict())
    if c.max_tokens is not None:
        out["max_tokens"] = c.max_tokens
    out["priority"] = c.priority
    out["tenant"] = c.tenant
    if c.length_estimate != "none":
        out["length_estimate"] = c.length_estimate
    if c.shared_prefixes:
        out.update(shared_prefixes=c.shared_prefixes, prefix_len=c.prefix_len)
    if c.multi_turn is not None:
        out["multi_turn"] = c.multi_turn.to_dict()
    return out


def save_workload(workload: Workload, path: str | Path) -> Path:
    """Write the workload as YAML (not its requests: use `save_trace` for those)."""
    p = Path(path)
    write_atomic(p, yaml.safe_dump(workload_to_dict(workload), sort_keys=False))
    return p


# ---- length distributions and arrival processes ----

LENGTH_KINDS = ("fixed", "uniform", "lognormal", "mixture", "empirical")


def parse_length(data: Any, where: str = "length", base_dir: Path | None = None) -> LengthDist:
    """Build a distribution from its YAML shape. `where` (e.g. `classes[1].output`) prefixes
    error messages; `base_dir` resolves relative empirical file paths."""
    try:
        return _length(data, base_dir)
    except WorkloadError as e:
        raise prefixed(where, e) from None


def _length(data: Any, base_dir: Path | None) -> LengthDist:
    if isinstance(data, int) and not isinstance(data, bool):
        return Fixed(data)  # shorthand: `output: 200`
    kind, body = one_key("", data, LENGTH_KINDS)
    if kind == "fixed":
        return Fixed(body)
    if kind == "uniform":
        if not isinstance(body, Sequence) or isinstance(body, str) or len(body) != 2:
            raise WorkloadError(f"uniform = {preview(body)}: must be [lo, hi], integers >= 1")
        return Uniform(body[0], body[1])
    if kind == "lognormal":
        if not isinstance(body, Mapping):
            raise WorkloadError(f"lognormal = {preview(body)}: must be a mapping {{p50, p99, max}}")
        check_keys("lognormal", body, ("p50", "p99", "max"), required=("p50", "p99"))
        return LogNormal(body["p50"], body["p99"], body.get("max"))
    if kind == "mixture":
        return _mixture(body, base_dir)
    return _empirical(body, base_dir)


def _mixture(body: Any, base_dir: Path | None) -> Mixture:
    if not isinstance(body, Sequence) or isinstance(body, str) or not body:
        raise WorkloadError(f"mixture = {preview(body)}: must be a non-empty list of "
                            "{weight: w, <distribution>}")
    parts = []
    for i, entry in enumerate(body):
        if not isinstance(entry, Mapping) or "weight" not in entry:
            raise WorkloadError(f"mixture[{i}] = {preview(entry)}: must be a mapping with 'weight' "
                                f"and one of: {', '.join(LENGTH_KINDS)}")
        rest = {k: v for k, v in entry.items() if k != "weight"}
        try:
            dist = _length(rest, base_dir)
        except WorkloadError as e:
            raise prefixed(f"mixture[{i}]", e) from None
        parts.append((entry["weight"], dist))
    return Mixture(tuple(parts))


def _empirical(body: Any, base_dir: Path | None) -> Empirical:
    if isinstance(body, Mapping):
        check_keys("empirical", body, ("file",), required=("file",))
        body = body["file"]
    if isinstance(body, str):
        return Empirical.from_file(_resolved(body, base_dir))
    if not isinstance(body, Sequence):
        raise WorkloadError(f"empirical = {preview(body)}: must be a list of integers >= 1 or "
                            "{file: path}")
    return Empirical(body)  # the constructor checks and freezes it


ARRIVAL_KINDS = ("poisson", "gamma", "constant", "closed_loop", "batch", "trace", *SHAPES)


def parse_arrival(data: Any, where: str = "arrival",
                  base_dir: Path | None = None) -> ArrivalProcess:
    """Build an arrival process from its YAML shape; `base_dir` resolves a relative trace."""
    try:
        return _arrival(data, base_dir)
    except WorkloadError as e:
        raise prefixed(where, e) from None


def _arrival_body(kind: str, body: Any, allowed: tuple[str, ...], required: tuple[str, ...]) -> Any:
    if not isinstance(body, Mapping):
        raise WorkloadError(f"{kind} = {preview(body)}: must be a mapping with keys "
                            f"{', '.join(allowed)}")
    check_keys(kind, body, allowed, required)
    return body


def _arrival(data: Any, base_dir: Path | None) -> ArrivalProcess:
    kind, body = one_key("", data, ARRIVAL_KINDS)
    if kind in ("poisson", "constant"):
        body = _arrival_body(kind, body, ("rate",), ("rate",))
        return Poisson(body["rate"]) if kind == "poisson" else Constant(body["rate"])
    if kind == "gamma":
        body = _arrival_body(kind, body, ("rate", "burstiness"), ("rate", "burstiness"))
        return Gamma(body["rate"], body["burstiness"])
    if kind in ("closed_loop", "batch"):
        body = _arrival_body(kind, body, ("concurrency",), ("concurrency",))
        return ClosedLoop(body["concurrency"])
    if kind in SHAPES:
        return SHAPES[kind](body)
    concurrency = None
    if isinstance(body, Mapping):
        check_keys("trace", body, ("path", "concurrency"), ("path",))
        concurrency = body.get("concurrency")
        body = body["path"]
    path = _resolved(check_str("trace", body), base_dir)
    if concurrency is not None:
        check_int("trace.concurrency", concurrency, lo=1, hi=MAX_CONCURRENCY)
    return trace_replay(path, concurrency)
