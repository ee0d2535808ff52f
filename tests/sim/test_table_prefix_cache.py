"""simulate's table shows the prefix cache's hit rate beside the repeated share."""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.report import format_runs


@dataclass
class Run:
    name: str
    summary: RunSummary


def test_the_table_has_a_row_of_hit_rate_and_repeated_share():
    text = format_runs([Run("warm", RunSummary.of(prefix_cache_hit_rate=0.125,
                                                  prefix_repeated_share=0.4)),
                        Run("old", RunSummary())])
    row = next(line for line in text.splitlines() if line.startswith("prefix cache"))
    assert "12.5% / 40.0%" in row and "- / -" in row
