"""The runs of a result file (ours of any version, a bare summary, or a `vllm bench serve`
result), each run's values checked before anything reads them. `stepserve doctor`
reasons from these numbers and `stepserve report` plots and prints them, so both read a
file through `result_runs` and refuse the same files with the same line: the file, the
run, and for each bad value its key, the value and what is allowed. A value of the wrong
kind would read as missing (a silent "no rule fires", a "-" in a table); an impossible
one (a negative count, a share of 1.5, a NaN, 1e30 tokens) would make the rules reason
from nonsense and overflow a plot's axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.metrics.rules import SETTING_TYPES
from stepserve.metrics.run_summary import FIELD_KINDS, allowed, value_kind
from stepserve.metrics.schema import check_schema
from stepserve.metrics.vllm_summary import is_vllm_result, vllm_problems, vllm_summary

# A bare summary must carry at least one of these (summary.py's keys).
SUMMARY_MARKERS = ("requests_total", "steps", "slot_utilization", "ttft_p50_s", "preemptions")


@dataclass(frozen=True)
class FileRun:
    """One run as the file has it, its values checked: the summary and config are the
    file's own mappings (a vLLM result's summary is read from its flat keys)."""

    name: str
    summary: Mapping[str, Any]
    batching: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    client_only: bool = False  # a vLLM bench result: no server-side numbers


def result_runs(data: Any, where: str) -> list[FileRun]:
    """The runs of a parsed result file; UsageError says what is wrong, naming `where`."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(data).__name__}")
    check_schema(data, where)
    if is_vllm_result(data):
        name = str(data.get("label") or data.get("backend") or Path(where).stem)
        problems = vllm_problems(data)
        if problems:  # before the summary is worked out from them
            raise UsageError(f"{where}: run {name}: values a vLLM bench result cannot "
                             f"have: {'; '.join(problems)}")
        summary = vllm_summary(data).to_json()
        check_run_values(where, name, summary, {})
        return [FileRun(name, summary, client_only=True)]
    if "runs" not in data:
        if not any(k in data for k in SUMMARY_MARKERS):
            raise UsageError(f"{where}: neither a result file (no \"runs\") nor a summary "
                             f"(none of {', '.join(SUMMARY_MARKERS)})")
        check_run_values(where, Path(where).stem, data, {})
        return [FileRun(Path(where).stem, data)]
    raw = data["runs"]
    if not isinstance(raw, list):
        raise UsageError(f"{where}: \"runs\" must be a list, got {type(raw).__name__}")
    if not raw:
        raise UsageError(f"{where}: the result has no runs (\"runs\" is empty)")
    runs = [_run(f"{where}: runs[{i}]", i, item) for i, item in enumerate(raw)]
    for run, item in zip(runs, raw, strict=True):
        check_run_values(where, run.name, run.summary, run.config)
        check_run_extras(where, run.name, item)
    return runs


def _run(where: str, i: int, item: Any) -> FileRun:
    """One run of a file, as the file has it (its values not yet checked)."""
    if not isinstance(item, dict):
        raise UsageError(f"{where} must be an object, got {type(item).__name__}")
    summary = item.get("summary")
    if not isinstance(summary, dict):
        raise UsageError(f"{where} has no \"summary\" object")
    config = item.get("config") or {}
    if not isinstance(config, dict):
        raise UsageError(f"{where}.config must be an object, got {type(config).__name__}")
    batching = item.get("batching")
    if batching is not None and not isinstance(batching, str):
        raise UsageError(f"{where}.batching must be a string, got {preview(batching)}")
    return FileRun(str(item.get("name", f"run {i}")), summary, batching, config)


def check_run_values(where: str, name: str, summary: Mapping[str, Any],
                     config: Mapping[str, Any]) -> None:
    """UsageError naming `where`, the run and each value of the wrong kind or impossible
    in its summary or config; nothing when every value is one a run can have."""
    wrong = wrong_types(summary, config)
    if wrong:
        raise UsageError(f"{where}: run {name}: values of the wrong type: {'; '.join(wrong)}")
    problems = impossible_values(summary, "summary.") + impossible_values(config, "config.")
    if problems:
        raise UsageError(f"{where}: run {name}: impossible values: {'; '.join(problems)}")


# the plotted series of a run: a time, a level, a count or a latency per point
SERIES_VALUE = Allowed(-1e18, 1e18, float)
LATENCY_VALUE = Allowed(0, 1e18, float)
SERIES = ("t", "waiting", "running", "kv_usage", "prefill_tokens", "decode_tokens",
          "preemptions", "steps")


def check_run_extras(where: str, name: str, item: Mapping[str, Any]) -> None:
    """A run's per-class summaries (checked as its summary is), its time series and its
    latency samples (lists of finite numbers, the series as long as `t`): what a report
    plots besides the summary. UsageError naming the first bad value."""
    at = f"{where}: run {name}"
    by_class = item.get("by_class")
    if by_class is not None:
        if not isinstance(by_class, Mapping):
            raise UsageError(f"{at}: by_class = {preview(by_class)}: must be an object of "
                             "class name -> summary")
        for cls, summary in by_class.items():
            if not isinstance(summary, Mapping):
                raise UsageError(f"{at}: by_class.{cls} = {preview(summary)}: must be a "
                                 "summary object")
            check_run_values(where, f"{name} class {cls}", summary, {})
    series = item.get("timeseries")
    if series is not None:
        if not isinstance(series, Mapping):
            raise UsageError(f"{at}: timeseries = {preview(series)}: must be an object of "
                             "series")
        length = None
        for key in SERIES:
            values = series.get(key)
            if values is None:
                continue
            _check_list(at, f"timeseries.{key}", values, SERIES_VALUE)
            if values and length is not None and len(values) != length:
                raise UsageError(f"{at}: timeseries.{key} holds {len(values)} points, t "
                                 f"{length}: every series has one a point of t")
            if key == "t":
                length = len(values)
    samples = item.get("latency_samples")
    if samples is not None:
        if not isinstance(samples, Mapping):
            raise UsageError(f"{at}: latency_samples = {preview(samples)}: must be an object "
                             "with ttft_s and e2e_s lists")
        for key in ("ttft_s", "e2e_s"):
            _check_list(at, f"latency_samples.{key}", samples.get(key, []), LATENCY_VALUE)
        Allowed(0, 10**18).check(f"{at}: latency_samples.count",
                                 samples.get("count", 0), UsageError)


def _check_list(at: str, key: str, values: Any, each: Allowed) -> None:
    if not isinstance(values, list):
        raise UsageError(f"{at}: {key} = {preview(values)}: must be a list of numbers")
    for i, v in enumerate(values):
        if (problem := each.problem(f"{key}[{i}]", v)) is not None:
            raise UsageError(f"{at}: {problem}")


def impossible_values(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`key = value: must be ...` for each impossible number, nested mappings (config
    sections, error counts) included, their keys prefixed `section.`."""
    problems: list[str] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            problems += impossible_values(value, f"{prefix}{key}.")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        problem = allowed(str(key)).problem(f"{prefix}{key}", value)
        if problem is not None:
            problems.append(problem)
    return problems


# the config settings the advice reads (RuleSettings), top level or one section deep
ADVICE_SETTINGS = {name: str if kind is str else float for name, kind in SETTING_TYPES.items()}
_KIND_TEXT = {float: "a number", str: "a string", bool: "true or false", dict: "an object",
              list: "a list"}


def wrong_types(summary: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """`summary.key = value (a string): must be a number (or null)` for each value a
    summary field holds that is not of its field's kind (a key no field has is not
    checked); the config's advice settings likewise, as `config.section.key`."""
    problems = [_wrong(f"summary.{key}", value, FIELD_KINDS[key])
                for key, value in summary.items() if key in FIELD_KINDS]
    for key, value in config.items():
        if isinstance(value, Mapping):
            problems += [_wrong(f"config.{key}.{sub}", v, ADVICE_SETTINGS[sub])
                         for sub, v in value.items() if sub in ADVICE_SETTINGS]
        elif key in ADVICE_SETTINGS:
            problems.append(_wrong(f"config.{key}", value, ADVICE_SETTINGS[key]))
    return [p for p in problems if p]


def _wrong(where: str, value: Any, kind: type) -> str:
    if value is None or value_kind(value) is kind:
        return ""
    found = _KIND_TEXT.get(value_kind(value), type(value).__name__)
    return f"{where} = {preview(value)} ({found}): must be {_KIND_TEXT[kind]} (or null)"
