"""A server's CPU sharing over a window of scrapes (server/cpu_metrics.py's series), as
the RunSummary's cpu fields: what `doctor --url` (live.py) and a bench run against a
target (bench/scrape.py) report.

  cpu_others_cores: the increase of cpu_others_seconds_total over the window's length;
  cpu_wait_share: the increase of cpu_runqueue_wait_seconds_total over that of wait +
      cpu_on_cpu_seconds_total;
  cpu_usable, step_time_over_quiet: the gauges at the window's end;
  cpu_source: "server" when any of them was there.

Several engines behind one /metrics (a cluster's merged page) each count the others'
CPU from their own process, the other engines included: the others' CPU and the gauges
are the largest engine's, not a sum; the wait and on-CPU times are summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stepserve.metrics.prometheus import Snapshot

P = "stepserve:"
CPU_KEYS = ("cpu_others_cores", "cpu_wait_share", "cpu_usable", "step_time_over_quiet",
            "cpu_source")


def _values(snapshot: Snapshot, name: str) -> list[float]:
    return [v for (n, _labels), v in snapshot.samples.items()
            if n == P + name and not math.isnan(v)]


def _sum(snapshot: Snapshot, name: str) -> float | None:
    vals = _values(snapshot, name)
    return sum(vals) if vals else None


def _max(snapshot: Snapshot, name: str) -> float | None:
    return max(_values(snapshot, name), default=None)


def _increase(first: Snapshot, last: Snapshot, name: str,
              pick: Callable[[Snapshot, str], float | None] = _sum) -> float | None:
    a, b = pick(first, name), pick(last, name)
    if a is None or b is None:
        return None
    return b - a if b >= a else b  # a restart in between: counted from it


def cpu_window(first: Snapshot, last: Snapshot) -> dict[str, Any]:
    """The CPU_KEYS over the window from `first` to `last` (None where not published)."""
    out: dict[str, Any] = dict.fromkeys(CPU_KEYS)
    wall = last.t_s - first.t_s
    others = _increase(first, last, "cpu_others_seconds_total", _max)
    if others is not None and wall > 0:
        out["cpu_others_cores"] = others / wall
    wait = _increase(first, last, "cpu_runqueue_wait_seconds_total")
    on = _increase(first, last, "cpu_on_cpu_seconds_total")
    if wait is not None and on is not None and wait + on > 0:
        out["cpu_wait_share"] = wait / (wait + on)
    out["cpu_usable"] = _max(last, "cpu_usable")
    out["step_time_over_quiet"] = _max(last, "step_time_over_quiet")
    if any(out[k] is not None for k in CPU_KEYS):
        out["cpu_source"] = "server"
    return out
