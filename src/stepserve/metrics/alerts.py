"""Applying the alert rules (rules.py) to runs: `diagnose` one summary, say which
rules a summary cannot feed (`unevaluable`), and the findings of every run of a result
(`findings_for`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from stepserve.metrics.finding import SEVERITIES, Finding
from stepserve.metrics.rule import RuleSettings
from stepserve.metrics.rules import RULES
from stepserve.metrics.rules_cpu import first_if_cpu_shared
from stepserve.metrics.run_summary import RunSummary


class DiagnosedRun(Protocol):
    """A run the rules can read: a result's run (sim/run.py, bench/results.py), a sweep
    point, or a run of a file the doctor loaded."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> RunSummary: ...

    def rule_settings(self) -> RuleSettings: ...


def diagnose(summary: RunSummary, settings: RuleSettings | None = None) -> list[Finding]:
    """Every rule that fires, most severe first (rule order within a severity); a
    shared CPU (rules_cpu.py) before them all."""
    settings = settings or RuleSettings.of(summary)
    found = [f for rule in RULES if (f := rule(summary, settings)) is not None]
    found = sorted(found, key=lambda f: SEVERITIES.index(f.severity))
    # the host's rule: a shared CPU goes first, whatever the severities
    return first_if_cpu_shared(summary, settings, found)


def unevaluable(summary: RunSummary) -> dict[str, list[str]]:
    """{rule: the inputs it lacks ("a or b" per group)} for each rule the summary cannot
    feed, in rule order."""
    return {rule.name: missing for rule in RULES if (missing := rule.missing(summary))}


def findings_for(runs: Iterable[DiagnosedRun]) -> list[Finding]:
    """Every rule that fires on each run, each finding naming its run."""
    return [f.on_run(run.name) for run in runs
            for f in diagnose(run.summary, run.rule_settings())]
