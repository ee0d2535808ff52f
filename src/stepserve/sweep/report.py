"""`stepserve report RESULT.json --out DIR`: PNG plots and one self-contained HTML page
(PNGs embedded as base64, also written beside it) for a `stepserve sweep --json`,
`stepserve simulate --json` or `stepserve bench --json` result.

Time series and CDFs need per-run `timeseries` and `latency_samples` (see
metrics.run_data.run_extras); runs without them are skipped with a note on the page.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from stepserve.sweep.knee import P99_METRIC, THROUGHPUT_METRIC
from stepserve.sweep.plots import (
    Group,
    knee_plot,
    latency_cdf,
    save,
    timeseries_plot,
    tokens_per_step_plot,
)
from stepserve.sweep.text import format_knees

SUMMARY_COLUMNS = (
    ("throughput_tokens_per_s", "tok/s", "{:.0f}"),
    ("ttft_p50_s", "TTFT P50", "{:.2f}"), ("ttft_p95_s", "P95", "{:.2f}"),
    ("ttft_p99_s", "P99", "{:.2f}"),
    ("e2e_p50_s", "E2E P50", "{:.2f}"), ("e2e_p95_s", "P95", "{:.2f}"),
    ("e2e_p99_s", "P99", "{:.2f}"),
    ("tpot_p99_s", "TPOT P99", "{:.3f}"), ("preemptions", "preempt", "{}"),
    ("waiting_max", "waiting max", "{}"), ("requests_finished", "done", "{}"),
)


def is_sweep(result: dict[str, Any]) -> bool:
    return result.get("kind") == "sweep"


def result_kind(result: dict[str, Any]) -> str:
    """sweep, bench (its runs name a target) or simulate."""
    if is_sweep(result):
        return "sweep"
    runs = result.get("runs") or []
    return "bench" if runs and all("target" in r for r in runs) else "simulate"


def groups_of(result: dict[str, Any]) -> list[Group]:
    """A panel per sweep series (lines per swept value), or one panel of all runs."""
    runs = result.get("runs") or []
    if not is_sweep(result) or result.get("x_axis") == "run":
        return [Group(result.get("scenario") or "runs", [r["name"] for r in runs], runs)]
    x = result["x_axis"]
    out: dict[str, Group] = {}
    for r in runs:
        name = r["sweep"]["series"]
        g = out.setdefault(name, Group(name, [], []))
        v = r["sweep"]["x"]
        g.labels.append(f"{x}={v:g}" if isinstance(v, float) else f"{x}={v}")
        g.runs.append(r)
    return list(out.values())


def knee_rule_slos(result: dict[str, Any]) -> list:
    return (result.get("knee_rule") or {}).get("slos") or []


def knee_series(result: dict[str, Any]) -> tuple[list[dict], str, str]:
    """(series for knee_plot, x axis name, P99 metric)."""
    if not is_sweep(result):
        runs = result["runs"]
        return ([{"name": "runs", "xs": [r["name"] for r in runs],
                  "throughput": [r["summary"].get(THROUGHPUT_METRIC) for r in runs],
                  "p99": [r["summary"].get(P99_METRIC) for r in runs],
                  "knee_index": None, "recommended_index": None}], "run", P99_METRIC)
    metric = result["knee_rule"]["p99_metric"]
    by_series: dict[str, list[dict]] = {}
    for r in result["runs"]:
        by_series.setdefault(r["sweep"]["series"], []).append(r)
    series = []
    for knee in result["knees"]:
        group = by_series[knee["series"]]
        series.append({"name": knee["series"], "xs": knee["xs"],
                       "throughput": [r["summary"].get(THROUGHPUT_METRIC) for r in group],
                       "p99": [r["summary"].get(metric) for r in group],
                       "knee_index": knee["knee_index"],
                       "recommended_index": knee["recommended_index"],
                       "best_slo_index": knee["best_slo_index"] if knee_rule_slos(result)
                       else None})
    return series, result["x_axis"], metric


def _plottable(groups: list[Group], key: str) -> tuple[list[Group], list[str]]:
    """Groups cut to runs that carry `key`, and a note naming runs that do not."""
    kept, missing = [], []
    for g in groups:
        pairs = [(lab, r) for lab, r in zip(g.labels, g.runs) if r.get(key)]
        missing += [r["name"] for r in g.runs if not r.get(key)]
        if pairs:
            kept.append(Group(g.name, [p[0] for p in pairs], [p[1] for p in pairs]))
    notes = [f"no `{key}` in the JSON for: {', '.join(missing)}; those plots are skipped "
             "(write the result with per-run data, see metrics.run_data.run_extras)"] \
        if missing else []
    return kept, notes


def write_plots(result: dict[str, Any], out: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Every plot the data allows: [(caption, png path)], notes."""
    out.mkdir(parents=True, exist_ok=True)
    pngs: list[tuple[str, Path]] = []
    series, x_name, metric = knee_series(result)
    if is_sweep(result):
        caption = (f"Throughput and {metric} against {x_name}; red X: knee, green star: "
                   "recommendation, blue diamond: highest load meeting the SLO")
    else:
        caption = (f"Throughput and {metric} per run (a {result_kind(result)} result: no "
                   "sweep, no knee)")
    pngs.append((caption, save(knee_plot(series, x_name, metric), out / "knee.png")))
    groups = groups_of(result)
    cdf_groups, notes = _plottable(groups, "latency_samples")
    if cdf_groups:
        pngs.append(("TTFT CDF per run",
                     save(latency_cdf(cdf_groups, "ttft_s", "TTFT CDF"), out / "cdf_ttft.png")))
        pngs.append(("End-to-end latency CDF per run",
                     save(latency_cdf(cdf_groups, "e2e_s", "E2E CDF"), out / "cdf_e2e.png")))
    ts_groups, ts_notes = _plottable(groups, "timeseries")
    notes += ts_notes
    if ts_groups:
        for field, ylabel, title, cumulative in (
                ("waiting", "requests waiting", "waiting queue", False),
                ("running", "sequences running", "running batch", False),
                ("preemptions", "preemptions so far", "preemptions (cumulative)", True)):
            fig = timeseries_plot(ts_groups, field, ylabel, title, cumulative)
            pngs.append((f"{title} over time", save(fig, out / f"ts_{field}.png")))
        pngs.append(("Prefill and decode tokens per step over time",
                     save(tokens_per_step_plot(ts_groups), out / "ts_tokens_per_step.png")))
    return pngs, notes


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def _summary_table(result: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for _k, h, _f in SUMMARY_COLUMNS)
    rows = []
    for r in result.get("runs", []):
        cells = "".join(f"<td>{_cell(r['summary'].get(k), f)}</td>" for k, _h, f in SUMMARY_COLUMNS)
        rows.append(f"<tr><td>{html.escape(r['name'])}</td>{cells}</tr>")
    return f"<table><tr><th>run</th>{head}</tr>{''.join(rows)}</table>"


def _knee_text(result: dict[str, Any]) -> str:
    if not is_sweep(result):
        return (f"<p>A {result_kind(result)} result: runs are compared side by side; no "
                "knee is computed.</p>")
    return f"<pre>{html.escape(format_knees(result))}</pre>"


def _findings(result: dict[str, Any]) -> str:
    items = [f"<li><b>{html.escape(f['run'])}</b> [{html.escape(f['severity'])}] "
             f"{html.escape(f['rule'])}: {html.escape(f['evidence'])} &rarr; "
             f"{html.escape(f['action'])}</li>" for f in result.get("findings", [])]
    return f"<ul>{''.join(items)}</ul>" if items else "<p>No alert rule fired.</p>"


def write_report(result: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the PNGs and index.html into out_dir; returns the page's path."""
    out = Path(out_dir)
    pngs, notes = write_plots(result, out)
    figures = "".join(
        f"<figure><img alt='{html.escape(cap)}' src='data:image/png;base64,"
        f"{base64.b64encode(path.read_bytes()).decode()}'><figcaption>{html.escape(cap)} "
        f"({path.name})</figcaption></figure>" for cap, path in pngs)
    note_html = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
    title = f"stepserve {result_kind(result)}: " \
            f"{result.get('scenario') or ', '.join(r['name'] for r in result.get('runs', []))}"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:auto}}
table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
img{{max-width:100%}}.note{{color:#a60}}pre{{font-size:12px;background:#f6f6f6;padding:6px}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>{html.escape(result.get('description', ''))}</p>
<p>Cost model: {html.escape(str(result.get('cost_model', '')))}</p>
<h2>Knee</h2>{_knee_text(result)}
<h2>Runs</h2>{_summary_table(result)}
<h2>Alert rules</h2>{_findings(result)}
<h2>Plots</h2>{note_html}{figures}
</body></html>"""
    path = out / "index.html"
    path.write_text(page)
    return path
