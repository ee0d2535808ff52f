"""Which values a run's summary and config can hold, so `stepserve doctor` refuses a file
with impossible ones (a negative count, a share of 1.5, a NaN) or of the wrong kind
(`"ttft_p99_s": "high"`) rather than reason from them or pass over them. Numbers are
classed by their key: the queue's fitted slopes may be negative, shares lie in [0, 1],
every other number is >= 0; all are finite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.metrics.rules import SETTING_TYPES
from stepserve.metrics.run_summary import FIELD_KINDS, value_kind

# fitted slopes of the waiting queue: a queue that drains has a negative one
SIGNED_KEYS = frozenset({"waiting_growth", "waiting_trend_rise"})
# far beyond any count, token total or duration a run can have; keeps the rules' float
# arithmetic from overflowing on a 400-digit integer
MAGNITUDE_MAX = 1e18


def _is_share(key: str) -> bool:
    return key.endswith("_share") or key in ("slot_utilization", "prefix_cache_hit_rate") \
        or key.startswith(("active_ratio_", "kv_usage_"))


def allowed(key: str) -> Allowed:
    """What the number under `key` may be (config/validate.py words it)."""
    if key in SIGNED_KEYS:
        return Allowed(-MAGNITUDE_MAX, MAGNITUDE_MAX, float)
    if _is_share(key):
        return Allowed(0.0, 1.0, float, note=" (a share)")
    return Allowed(0.0, MAGNITUDE_MAX, float)


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
    doctor reads that is not of its field's kind; the config's advice settings likewise,
    as `config.section.key`."""
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
