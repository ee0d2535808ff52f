"""benchmarks/contention.py's results: one run per server, condition and concurrency,
and the printed tables with their ratios."""

from __future__ import annotations

from dataclasses import dataclass

from engine_vs_llamacpp import METRICS, ratio

QUIET = "quiet"
OURS, THEIRS = "stepserve", "llama.cpp"


@dataclass
class Run:
    server: str
    condition: str
    concurrency: int
    seed: int
    uptime_before: str  # `uptime` just before the condition's load started
    loadavg_after: list[float]
    summary: dict[str, float | None]  # `stepserve bench`'s summary of the run
    wall_s: float


def _cells(label: str, server: str, values: list[str]) -> str:
    return f"{label:<18}{server:<14}" + "".join(f"{v:>14}" for v in values)


def _values(run: Run) -> list[str]:
    return ["-" if (v := run.summary.get(key)) is None else f"{v * scale:.1f}"
            for _, key, scale in METRICS]


def _ratios(a: Run, b: Run | None) -> list[str]:
    return [ratio(a.summary.get(key), None if b is None else b.summary.get(key))
            for _, key, _ in METRICS]


def format_table(runs: list[Run], concurrency: int) -> str:
    """One concurrency's runs: each condition's row per server, its ratio to the same
    server's quiet run, and stepserve / llama.cpp under that condition when both ran."""
    mine = [r for r in runs if r.concurrency == concurrency]
    by = {(r.server, r.condition): r for r in mine}
    servers = list(dict.fromkeys(r.server for r in mine))
    head = _cells("condition", "server", [name for name, _, _ in METRICS])
    lines = [f"c={concurrency}", head, "-" * len(head)]
    for condition in dict.fromkeys(r.condition for r in mine):
        label = condition
        for server in servers:
            if (run := by.get((server, condition))) is None:
                continue
            lines.append(_cells(label, server, _values(run)))
            label = ""
            if condition != QUIET:
                lines.append(_cells("", "  vs quiet", _ratios(run, by.get((server, QUIET)))))
        if (ours := by.get((OURS, condition))) and (theirs := by.get((THEIRS, condition))):
            lines.append(_cells("", f"  {OURS}/{THEIRS.split('.')[0]}", _ratios(ours, theirs)))
    return "\n".join(lines)


def format_tables(runs: list[Run]) -> str:
    tables = [format_table(runs, c) for c in dict.fromkeys(r.concurrency for r in runs)]
    both = any(r.server == THEIRS for r in runs)
    note = ("latencies in ms; vs quiet = this condition / the same server's quiet run"
            + (", stepserve/llama = stepserve / llama.cpp under the same condition" if both
               else "") + " (throughput: higher is better, latencies: lower is better)")
    return "\n\n".join([*tables, note])
