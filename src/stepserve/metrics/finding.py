"""A Finding: one alert rule that fired, with the numbers it saw and what to change;
`run` names the run it fired on where a result holds several."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # critical | warning | info
    evidence: str  # what was seen, with the numbers
    action: str  # what to change, naming the setting
    run: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity = {self.severity!r}: must be one of "
                             f"{', '.join(SEVERITIES)}")

    def on_run(self, run: str) -> Finding:
        return replace(self, run=run)

    def to_json(self) -> dict[str, str]:
        """{"run"?, "rule", "severity", "evidence", "action"}: the published row."""
        row = {"run": self.run} if self.run is not None else {}
        return {**row, "rule": self.rule, "severity": self.severity,
                "evidence": self.evidence, "action": self.action}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        run = data.get("run")
        return cls(str(data["rule"]), str(data["severity"]), str(data.get("evidence", "")),
                   str(data.get("action", "")), None if run is None else str(run))
