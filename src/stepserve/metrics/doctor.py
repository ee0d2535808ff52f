"""`stepserve doctor RESULT.json | --url http://HOST:PORT [--json]`: which alert rules
fire, applied afresh to a result file of any version, a bare summary, a vLLM bench result
or a live server's window (the JSON then also carries its "summary", "config" and
"not_evaluable"). A bad file or target is a UsageError, a file with values of the wrong
kind or impossible ones (a negative count, a share of 1.5, a NaN) included, so the rules
never reason from them; otherwise 0, whatever fires.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_SECONDS, Range, check_flags
from stepserve.config.user_files import load_json, preview
from stepserve.metrics.live_window import (
    INTERVAL_S,
    WINDOW_S,
    LiveScrapeError,
    live_config,
    live_summary,
    non_finite_series,
    pool_windows,
    scrape_window,
    window_notes,
)
from stepserve.metrics.prometheus import Snapshot
from stepserve.metrics.rules import SETTING_TYPES, Finding, RuleSettings, diagnose, unevaluable
from stepserve.metrics.run_summary import FIELD_KINDS, RunSummary, allowed, value_kind
from stepserve.metrics.schema import check_schema
from stepserve.metrics.vllm_summary import is_vllm_result, vllm_summary

# --window-s and --interval-s: a millisecond to a month; at most MAX_SCRAPES snapshots
# are kept (each is a parsed /metrics page)
DOCTOR_FLAGS = {"window_s": Range(1e-3, MAX_SECONDS, float),
                "interval_s": Range(1e-3, MAX_SECONDS, float)}
MAX_SCRAPES = 10_000
# A bare summary must carry at least one of these (summary.py's keys).
_SUMMARY_MARKERS = ("requests_total", "steps", "slot_utilization", "ttft_p50_s", "preemptions")


@dataclass(frozen=True)
class Run:
    """A run as the doctor reads it: its summary, and its config as the file (or the
    server) gives it, whose settings the advice may name."""

    name: str
    summary: RunSummary
    batching: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    client_only: bool = False  # a vLLM bench result: no server-side numbers

    def rule_settings(self) -> RuleSettings:
        return RuleSettings.of(self.summary, self.config, self.batching)


def load_runs(path: str) -> list[Run]:
    """The runs in a result file; UsageError says what is wrong, naming the file."""
    data = load_json(path, "result file")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(data).__name__}")
    check_schema(data, path)
    if is_vllm_result(data):
        name = str(data.get("label") or data.get("backend") or Path(path).stem)
        return [replace(_checked(path, name, vllm_summary(data).to_json(), None, {}),
                        client_only=True)]
    if "runs" not in data:
        if not any(k in data for k in _SUMMARY_MARKERS):
            raise UsageError(f"{path}: neither a result file (no \"runs\") nor a summary "
                             f"(none of {', '.join(_SUMMARY_MARKERS)})")
        return [_checked(path, Path(path).stem, data, None, {})]
    raw = data["runs"]
    if not isinstance(raw, list):
        raise UsageError(f"{path}: \"runs\" must be a list, got {type(raw).__name__}")
    if not raw:
        raise UsageError(f"{path}: the result has no runs (\"runs\" is empty): nothing to "
                         "diagnose")
    return [_checked(path, *_run(f"{path}: runs[{i}]", i, item)) for i, item in enumerate(raw)]


def _run(where: str, i: int, item: Any) -> tuple[str, dict, str | None, dict]:
    """(name, summary, batching, config) of one run of a file, as the file has them."""
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
    return str(item.get("name", f"run {i}")), summary, batching, config


def _checked(path: str, name: str, summary: dict, batching: str | None,
             config: dict) -> Run:
    """The run, unless its summary or config holds a value no run can have."""
    wrong = wrong_types(summary, config)
    if wrong:
        raise UsageError(f"{path}: run {name}: values of the wrong type: {'; '.join(wrong)}")
    problems = impossible_values(summary, "summary.") + impossible_values(config, "config.")
    if problems:
        raise UsageError(f"{path}: run {name}: impossible values: {'; '.join(problems)}")
    return Run(name, RunSummary.from_json(summary), batching, config)


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
    """`summary.key = value (a string): must be a number (or null)` for each value the
    doctor reads that is not of its field's kind (a key it does not read is not checked);
    the config's advice settings likewise, as `config.section.key`."""
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


@dataclass(frozen=True)
class DoctorOptions:
    """Exactly one of `result` (a result file or a bare summary) or `url` (a live server,
    scraped for `window_s`, every `interval_s`); `as_json`: print JSON, not text."""

    result: str | None = None
    url: str | None = None
    window_s: float = WINDOW_S
    interval_s: float = INTERVAL_S
    as_json: bool = False


def run_doctor(options: DoctorOptions) -> int:
    """Print the findings; 0 whatever fires (a UsageError for a bad file or target)."""
    if (options.result is None) == (options.url is None):
        raise UsageError("give exactly one of RESULT.json (a result file) or --url "
                         "http://HOST:PORT (a live server)")
    if options.url is not None:
        return run_live(options, options.url)
    runs = load_runs(options.result)
    client_only = {run.name: unevaluable(run.summary) for run in runs if run.client_only}
    notes = [f"  a client-side vLLM bench result: {len(missing)} rule(s) cannot run without "
             f"server-side data ({', '.join(missing) or 'none'}); run `stepserve doctor "
             "--url` or `stepserve bench --target` (it scrapes /metrics) for those"
             for missing in client_only.values()]
    extra = {"not_evaluable": next(iter(client_only.values()))} if client_only else {}
    return _print(options, [(run, diagnose(run.summary, run.rule_settings())) for run in runs],
                  extra, notes)


def run_live(options: DoctorOptions, url: str) -> int:
    check_flags(options, DOCTOR_FLAGS)  # the window only matters here
    window_s, interval_s = options.window_s, options.interval_s
    if window_s / interval_s > MAX_SCRAPES:
        raise UsageError(f"--window-s {window_s:g} / --interval-s {interval_s:g}: "
                         f"more than {MAX_SCRAPES:,} scrapes; scrape less often")
    try:
        window = scrape_window(url, window_s, interval_s)
    except LiveScrapeError as exc:
        raise UsageError(str(exc)) from None
    results = live_runs(url, window.snapshots)
    (run, _), pools = results[0], results[1:]
    missing = unevaluable(run.summary)
    non_finite = non_finite_series(window.snapshots)
    extra = {"summary": run.summary.to_json(), "config": run.config, "not_evaluable": missing,
             "failed_scrapes": window.failures,
             **({"non_finite_series": non_finite} if non_finite else {}),
             **({"pools": {r.name: r.summary.to_json() for r, _ in pools}} if pools else {})}
    return _print(options, results, extra,
                  window_notes(run.summary, missing, window.failures, non_finite))


def _print(options: DoctorOptions, results: list[tuple[Run, list[Finding]]],
           extra: dict[str, Any], notes: list[str]) -> int:
    """The findings as JSON (each naming its run, then `extra`), or as text and `notes`."""
    if options.as_json:
        rows = [f.on_run(run.name).to_json() for run, found in results for f in found]
        print(json.dumps({"findings": rows, **extra}, indent=2))
    else:
        print("\n".join([format_report(results), *notes]))
    return 0


def live_runs(url: str, snapshots: list[Snapshot]) -> list[tuple[Run, list[Finding]]]:
    """The rules on the whole server's window, then on each pool's (a cluster ingress
    labels every series with its replica's `pool`): a finding names the pool it is in."""
    windows = [(url, snapshots)] + [(f"{url} pool {name}", part)
                                    for name, part in pool_windows(snapshots).items()]
    out = []
    for name, part in windows:
        summary, config = live_summary(part), live_config(part[-1])
        run = Run(name=name, summary=summary, batching=config.get("batching"), config=config)
        out.append((run, diagnose(summary, run.rule_settings())))
    return out


def format_report(results: list[tuple[Run, list[Finding]]]) -> str:
    lines: list[str] = []
    for run, found in results:
        mode = f" ({run.batching})" if run.batching else ""
        count = f"{len(found)} finding(s)" if found else "no rule fires"
        lines.append(f"run {run.name}{mode}: {count}")
        for f in found:
            lines.append(f"  [{f.severity}] {f.rule}")
            lines += _wrapped("evidence", f.evidence)
            lines += _wrapped("action", f.action)
    return "\n".join(lines)


def _wrapped(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, width=100, initial_indent=f"    {label + ':':<10}",
                         subsequent_indent=" " * 14, break_on_hyphens=False)
