"""A `vllm bench serve --save-result` file (or `stepserve bench --save-result`'s), known by
its keys, as a RunSummary for `doctor` and `report` (bench/results.py lists the keys).
Milliseconds become seconds, `median` is P50, and a percentile the file lacks is computed
from the per-request lists where it has them (`--save-detailed`). A run with no completed
request has no latencies (vLLM writes 0.0 there). It is the client's view only: the rules
that need the server's side cannot run (`rules.unevaluable` names them). The values it
is read from must be numbers it can hold (`vllm_problems`), so a bad file is refused,
not read as missing or overflowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepserve.config.validate import Allowed, preview
from stepserve.metrics.run_summary import MAGNITUDE_MAX, RunSummary, value_kind
from stepserve.metrics.summary import latency_fields

VLLM_MARKERS = ("completed", "duration", "request_throughput")
# vLLM's metric name -> ours
METRIC_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


def is_vllm_result(data: Any) -> bool:
    """A flat vLLM bench result: every marker key, and no `runs` list (ours has one)."""
    return isinstance(data, dict) and "runs" not in data \
        and all(k in data for k in VLLM_MARKERS)


# the numbers the summary is read from (counts, seconds, milliseconds, rates: none negative)
NUMBER_KEYS = ("completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_goodput", "duration", "output_throughput", "request_throughput",
               *(f"{stat}_{theirs}_ms" for theirs in METRIC_NAMES
                 for stat in ("mean", "median", "p50", "p95", "p99")))
# the per-request lists the percentiles and the CDFs are read from, as numbers
LIST_KEYS = ("ttfts", "output_lens")
_NUMBER = Allowed(0.0, MAGNITUDE_MAX, float, optional=True)
_ENTRY = Allowed(0.0, MAGNITUDE_MAX, float)


def vllm_problems(data: Mapping[str, Any]) -> list[str]:
    """`key = value: must be ...` for each value the summary would be read from that is
    not a number it can hold (a string would read as missing, a NaN or 1e30 overflow the
    sums made of it); a per-request list names its first bad entry."""
    problems = [p for key in NUMBER_KEYS if key in data
                if (p := _NUMBER.problem(key, data[key])) is not None]
    for key in LIST_KEYS:
        if isinstance(data.get(key), list):
            problems += _first_bad(key, data[key])
    itls = data.get("itls")
    for i, gaps in enumerate(itls if isinstance(itls, list) else []):
        bad = _first_bad(f"itls[{i}]", gaps) if isinstance(gaps, list) else \
            [f"itls[{i}] = {preview(gaps)}: must be a list of numbers"]
        if bad:
            problems += bad
            break
    return problems


def _first_bad(key: str, values: list[Any]) -> list[str]:
    """The refusal of the first entry of `values` that is no number in range, if any."""
    for i, value in enumerate(values):
        problem = _ENTRY.problem(f"{key}[{i}]", value)
        if problem is not None:
            return [problem]
    return []


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if value_kind(value) is float else None


def _seconds(data: Mapping[str, Any], key: str) -> float | None:
    ms = _number(data, key)
    return None if ms is None else ms / 1000.0


def _per_request(data: Mapping[str, Any]) -> dict[str, list[float]] | None:
    """Each completed request's TTFT, TPOT, ITL gaps and E2EL from the detailed lists
    (E2EL = TTFT + its gaps, as vLLM's latency is the last chunk's time), or None."""
    ttfts, itls, outs, errors = (data.get(k) for k in ("ttfts", "itls", "output_lens",
                                                         "errors"))
    if not all(isinstance(x, list) for x in (ttfts, itls, outs, errors)):
        return None
    values: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2el": []}
    for ttft, gaps, n, error in zip(ttfts, itls, outs, errors, strict=False):
        if error or not isinstance(gaps, list):
            continue
        e2el = float(ttft) + float(sum(gaps))
        values["ttft"].append(float(ttft))
        values["itl"] += [float(g) for g in gaps]
        values["e2el"].append(e2el)
        if isinstance(n, int) and n > 1:
            values["tpot"].append((e2el - float(ttft)) / (n - 1))
    return values


def _latencies(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The file's latencies, computed from its per-request lists where it lacks one."""
    raw = _per_request(data) or {}
    given: dict[str, float | None] = {}
    for theirs, ours in METRIC_NAMES.items():
        median = _seconds(data, f"median_{theirs}_ms")
        given[f"{ours}_mean_s"] = _seconds(data, f"mean_{theirs}_ms")
        given[f"{ours}_p50_s"] = median if median is not None \
            else _seconds(data, f"p50_{theirs}_ms")
        for p in (95, 99):
            given[f"{ours}_p{p}_s"] = _seconds(data, f"p{p}_{theirs}_ms")
    values = {ours: raw.get(theirs, []) for theirs, ours in METRIC_NAMES.items()}
    return latency_fields(values, max_of=("itl",) if values["itl"] else (), given=given)


def vllm_summary(data: Mapping[str, Any]) -> RunSummary:
    """The RunSummary of a vLLM result: the client's fields it carries (module doc)."""
    completed, failed = _number(data, "completed"), _number(data, "failed")
    if failed is None and isinstance(data.get("errors"), list):
        failed = float(sum(1 for e in data["errors"] if e))
    prompt, output = _number(data, "total_input_tokens"), _number(data, "total_output_tokens")
    goodput, duration = _number(data, "request_goodput"), _number(data, "duration")
    values: dict[str, Any] = {
        "requests_total": None if completed is None or failed is None else completed + failed,
        "requests_finished": completed, "requests_failed": failed,
        "output_tokens": output, "prompt_tokens": prompt, "duration_s": duration,
        "throughput_tokens_per_s": _number(data, "output_throughput"),
        "throughput_requests_per_s": _number(data, "request_throughput")}
    if completed:  # vLLM writes 0.0 for the latencies of a run where none completed
        values.update(_latencies(data))
    values["goodput_requests_per_s"] = goodput
    values["goodput_requests"] = None if goodput is None or duration is None \
        else round(goodput * duration)
    return RunSummary.of(**values)
