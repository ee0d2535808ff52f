"""What an alert rule is: a check over a RunSummary that declares the summary fields it
needs, and the engine settings its advice may name.

A rule declares its inputs as RunSummary fields, in groups: `@rule((RunSummary.
preemptions,), (RunSummary.p99_p50_e2e_ratio, RunSummary.p99_p50_ttft_ratio))` needs the
preemptions and at least one of the two ratios. A name that is no field fails at import.
When every field of a group is None (a live scrape or another tool's file may lack it)
the rule cannot run: it stays silent rather than guess, and `missing` says what it lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stepserve.metrics.finding import Finding
from stepserve.metrics.run_summary import RunSummary, field_name


@dataclass(frozen=True)
class RuleSettings:
    """The settings the rules' advice names (the chunk cap actually set, max_num_seqs
    now): from the summary where it carries them (sim/run.py copies them in), else from
    a run's config (flat, or nested by section like EngineConfig's JSON), else the run's
    batching mode. None where unknown: the advice then speaks in general terms."""

    batching: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    budget_order: str | None = None
    replicas: int | None = None
    max_model_len: int | None = None
    max_waiting: int | None = None
    max_queue_time_s: float | None = None

    @classmethod
    def of(cls, summary: RunSummary, config: Mapping[str, Any] | None = None,
           batching: str | None = None) -> RuleSettings:
        def pick(name: str, kind: type) -> Any:
            # a setting no summary carries (max_model_len) comes from the config only
            for value in (getattr(summary, name, None), _from_config(config or {}, name)):
                if value is not None:
                    return _as(kind, value)
            return None

        return cls(batching=pick("batching", str) or batching,
                   max_num_seqs=pick("max_num_seqs", int),
                   max_num_batched_tokens=pick("max_num_batched_tokens", int),
                   long_prefill_token_threshold=pick("long_prefill_token_threshold", int),
                   budget_order=pick("budget_order", str), replicas=pick("replicas", int),
                   max_model_len=pick("max_model_len", int),
                   max_waiting=pick("max_waiting", int),
                   max_queue_time_s=pick("max_queue_time_s", float))


def _from_config(config: Mapping[str, Any], key: str) -> Any:
    """`key` at the config's top level, else one section deep."""
    if config.get(key) is not None:
        return config[key]
    for section in config.values():
        if isinstance(section, Mapping) and section.get(key) is not None:
            return section[key]
    return None


def _as(kind: type, value: Any) -> Any:
    """A setting of the expected kind, else None (a file may hold anything)."""
    number = (isinstance(value, int) and not isinstance(value, bool)) \
        or (isinstance(value, float) and math.isfinite(value))
    if kind is int:
        return int(value) if number and (isinstance(value, int) or value.is_integer()) \
            else None
    if kind is float:
        return float(value) if number else None
    return value if isinstance(value, kind) else None


Check = Callable[[RunSummary, RuleSettings], "Finding | None"]


@dataclass(frozen=True)
class Rule:
    check: Check
    needs: tuple[tuple[str, ...], ...]  # RunSummary field names; one of each group

    @property
    def name(self) -> str:
        return self.check.__name__

    def missing(self, summary: RunSummary) -> list[str]:
        """The groups of inputs the summary has no value for, as "a or b"."""
        return [" or ".join(group) for group in self.needs
                if all(getattr(summary, name) is None for name in group)]

    def __call__(self, summary: RunSummary, settings: RuleSettings | None = None
                 ) -> Finding | None:
        if self.missing(summary):
            return None  # cannot run: a rule that cannot see its evidence must not guess
        return self.check(summary, settings or RuleSettings.of(summary))


def rule(*needs: tuple[Any, ...]) -> Callable[[Check], Rule]:
    """Declare a rule and the RunSummary fields it needs (see the module docstring)."""
    groups = tuple(tuple(field_name(f) for f in group) for group in needs)

    def declare(check: Check) -> Rule:
        return Rule(check, groups)

    return declare


S = RunSummary  # a rule's inputs are its fields: @rule((S.preemptions,))


def pct(x: float) -> str:
    """A share as a rule's evidence writes it: 0.1234 -> "12.3%"."""
    return f"{x:.1%}"
