"""The YAML shapes of length distributions and arrival processes.

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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stepserve.config.limits import MAX_CONCURRENCY
from stepserve.config.user_files import preview
from stepserve.workload.arrival_shapes import SHAPES
from stepserve.workload.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    trace_replay,
)
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_keys,
    check_str,
    one_key,
    prefixed,
)
from stepserve.workload.lengths import Empirical, Fixed, LengthDist, LogNormal, Mixture, Uniform

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
        path = Path(body)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return Empirical.from_file(path)
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
    path = Path(check_str("trace", body))
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if concurrency is not None:
        check_int("trace.concurrency", concurrency, lo=1, hi=MAX_CONCURRENCY)
    return trace_replay(path, concurrency)
