"""`stepserve doctor RESULT.json | --url http://HOST:PORT [--json]`: which alert rules
fire, applied afresh to a result file of any version, a bare summary, a vLLM bench result
or a live server's window (the JSON then also carries its "summary", "config" and
"not_evaluable"). The engine settings the advice names come from the summary, the file's
config or the server's info gauge, and those given to the doctor (`--config FILE`,
`--max-num-seqs N`: `GivenSettings`) win over them: vLLM publishes none. A bad file,
setting or target is a UsageError, a file with values of the wrong kind or impossible
ones (a negative count, a share of 1.5, a NaN) included, so the rules never reason from
them (result_runs.py checks them, as it does for `stepserve report`); otherwise 0,
whatever fires.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_SECONDS, Range, check_flags
from stepserve.config.load import ConfigOverrides, config_fields
from stepserve.config.user_files import load_json
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
from stepserve.metrics.quantile_bounds import bounds_notes
from stepserve.metrics.result_runs import result_runs
from stepserve.metrics.rules import SETTING_TYPES, Finding, RuleSettings, diagnose, unevaluable
from stepserve.metrics.run_summary import RunSummary

# --window-s and --interval-s: a millisecond to a month; at most MAX_SCRAPES snapshots
# are kept (each is a parsed /metrics page)
DOCTOR_FLAGS = {"window_s": Range(1e-3, MAX_SECONDS, float),
                "interval_s": Range(1e-3, MAX_SECONDS, float)}
MAX_SCRAPES = 10_000


@dataclass(frozen=True)
class GivenSettings:
    """The engine settings the doctor was given (a `--config` file, vLLM-style flags), by
    our names, each with where it came from (`--max-num-seqs`, `--config serve.yaml`):
    what the server runs with, where it does not say (vLLM publishes no scheduler
    settings)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    origin: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, overrides: ConfigOverrides) -> GivenSettings:
        """The settings the user chose, checked as any config is (a bad value is a
        ConfigError naming it); our defaults stand for nothing the server runs with, so
        only those chosen are kept."""
        if not overrides.given:
            return cls()
        config = overrides.apply()
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for section, f in config_fields():
            if overrides.sets(f.name):
                values[f.name] = getattr(getattr(config, section) if section else config,
                                         f.name)
                origin[f.name] = ("--" + f.name.replace("_", "-")
                                  if f.name in overrides.settings
                                  else f"--config {overrides.config_file}")
        return cls(values, origin)


@dataclass(frozen=True)
class Run:
    """A run as the doctor reads it: its summary, its config as the file (or the server)
    gives it, and the settings the doctor was given, which win; the advice names them."""

    name: str
    summary: RunSummary
    batching: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    client_only: bool = False  # a vLLM bench result: no server-side numbers
    given: GivenSettings = field(default_factory=GivenSettings)
    published_by: str | None = None  # the info gauge a live server's config was read from

    def rule_settings(self) -> RuleSettings:
        found = RuleSettings.of(self.summary, self.config, self.batching)
        return replace(found, **{k: v for k, v in self.given.values.items()
                                 if k in SETTING_TYPES})


def load_runs(path: str, given: GivenSettings | None = None) -> list[Run]:
    """The runs in a result file, their values checked (result_runs); UsageError says
    what is wrong, naming the file."""
    given = given or GivenSettings()
    return [Run(r.name, RunSummary.from_json(r.summary), r.batching, r.config, r.client_only,
                given)
            for r in result_runs(load_json(path, "result file"), path)]


@dataclass(frozen=True)
class DoctorOptions:
    """Exactly one of `result` (a result file or a bare summary) or `url` (a live server,
    scraped for `window_s`, every `interval_s`); `as_json`: print JSON, not text."""

    result: str | None = None
    url: str | None = None
    window_s: float = WINDOW_S
    interval_s: float = INTERVAL_S
    as_json: bool = False
    settings: ConfigOverrides = field(default_factory=ConfigOverrides)


def run_doctor(options: DoctorOptions) -> int:
    """Print the findings; 0 whatever fires (a UsageError for a bad file, setting or
    target)."""
    if (options.result is None) == (options.url is None):
        raise UsageError("give exactly one of RESULT.json (a result file) or --url "
                         "http://HOST:PORT (a live server)")
    given = GivenSettings.of(options.settings)
    if options.url is not None:
        return run_live(options, options.url, given)
    runs = load_runs(options.result, given)
    client_only = {run.name: unevaluable(run.summary, run.rule_settings())
                   for run in runs if run.client_only}
    notes = [f"  a client-side vLLM bench result: {len(missing)} rule(s) cannot run without "
             f"server-side data ({', '.join(missing) or 'none'}); run `stepserve doctor "
             "--url` or `stepserve bench --target` (it scrapes /metrics) for those"
             for missing in client_only.values()]
    notes += settings_notes(runs[0], {}) if given.values else []
    extra = {"not_evaluable": next(iter(client_only.values()))} if client_only else {}
    return _print(options, [(run, diagnose(run.summary, run.rule_settings())) for run in runs],
                  extra, notes)


def run_live(options: DoctorOptions, url: str, given: GivenSettings | None = None) -> int:
    check_flags(options, DOCTOR_FLAGS)  # the window only matters here
    window_s, interval_s = options.window_s, options.interval_s
    if window_s / interval_s > MAX_SCRAPES:
        raise UsageError(f"--window-s {window_s:g} / --interval-s {interval_s:g}: "
                         f"more than {MAX_SCRAPES:,} scrapes; scrape less often")
    try:
        window = scrape_window(url, window_s, interval_s)
    except LiveScrapeError as exc:
        raise UsageError(str(exc)) from None
    results = live_runs(url, window.snapshots, given)
    (run, _), pools = results[0], results[1:]
    missing = unevaluable(run.summary, run.rule_settings())
    non_finite = non_finite_series(window.snapshots)
    bound_lines, bounds = bounds_notes(run.summary)
    origin = settings_origin(run)
    extra = {"summary": run.summary.to_json(),
             "config": {**run.config, **run.given.values}, "not_evaluable": missing,
             "failed_scrapes": window.failures,
             **({"settings_from": origin} if origin else {}),
             **({"bounds": bounds} if bounds else {}),
             **({"non_finite_series": non_finite} if non_finite else {}),
             **({"pools": {r.name: r.summary.to_json() for r, _ in pools}} if pools else {})}
    return _print(options, results, extra,
                  window_notes(run.summary, missing, window.failures, non_finite)
                  + bound_lines + settings_notes(run, missing))


def settings_origin(run: Run) -> dict[str, str]:
    """{setting: where its value came from}: the given settings, and a live server's
    published ones (a file's config is the file's own, and not listed)."""
    published = dict.fromkeys(run.config, run.published_by) if run.published_by else {}
    return {**published, **run.given.origin}


def settings_notes(run: Run, missing: Mapping[str, list[str]]) -> list[str]:
    """The report's lines on the settings: which the advice names and where each came
    from, and each setting a rule could not be evaluated without (a server that
    publishes none, such as vLLM: give it with --config FILE or the setting's flag)."""
    values = {**run.config, **run.given.values}
    by_origin: dict[str, list[str]] = {}
    for name, origin in settings_origin(run).items():
        overridden = name in run.given.values and name in run.config \
            and run.config[name] != values[name]
        note = f" (the server publishes {run.config[name]})" if overridden else ""
        by_origin.setdefault(origin, []).append(f"{name} = {values[name]}{note}")
    lines = [f"  settings from {origin}: {', '.join(shown)}"
             for origin, shown in by_origin.items()]
    needed: dict[str, list[str]] = {}
    for rule, groups in missing.items():
        for name in {n for group in groups for n in group.split(" or ") if n in SETTING_TYPES}:
            needed.setdefault(name, []).append(rule)
    who = run.summary.metrics_source or "the server"
    why = f"{who} does not publish it" if run.config else \
        f"{who} publishes no scheduler settings"
    for name, rules in needed.items():
        flag = "--" + name.replace("_", "-")
        lines.append(f"  {name} unknown ({why}; give {flag} N or --config FILE): not "
                     f"evaluated without it: {', '.join(rules)}")
    return lines


def _print(options: DoctorOptions, results: list[tuple[Run, list[Finding]]],
           extra: dict[str, Any], notes: list[str]) -> int:
    """The findings as JSON (each naming its run, then `extra`), or as text and `notes`."""
    if options.as_json:
        rows = [f.on_run(run.name).to_json() for run, found in results for f in found]
        print(json.dumps({"findings": rows, **extra}, indent=2))
    else:
        print("\n".join([format_report(results), *notes]))
    return 0


def live_runs(url: str, snapshots: list[Snapshot], given: GivenSettings | None = None
              ) -> list[tuple[Run, list[Finding]]]:
    """The rules on the whole server's window, then on each pool's (a cluster ingress
    labels every series with its replica's `pool`): a finding names the pool it is in."""
    windows = [(url, snapshots)] + [(f"{url} pool {name}", part)
                                    for name, part in pool_windows(snapshots).items()]
    out = []
    for name, part in windows:
        summary, config = live_summary(part), live_config(part[-1])
        source = part[-1].source()
        published = f"the server's {source.prefix}{source.config_info}" \
            if source is not None and source.config_info and config else None
        run = Run(name=name, summary=summary, batching=config.get("batching"), config=config,
                  given=given or GivenSettings(), published_by=published)
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
