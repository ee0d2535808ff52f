"""A live server's `/metrics` scraped over a window into a RunSummary for `stepserve doctor
--url`: gauges read at every scrape, counters and histograms as the increase from the
first scrape to the last. A failed scrape is skipped and reported (the first is tried
twice); a window needs two that worked. How the keys (LIVE_KEYS) differ from a
simulation's: quantiles are interpolated inside histogram buckets (histogram_quantile;
those in a wide bucket keep its bounds, quantile_bounds.py), TPOT (per request) and ITL
(per token gap) each come from their own histogram (SGLang's tpot_p50_s is its ITL),
requests_total counts the requests that ended or were refused in the window,
prefill_token_share counts a prompt once (cache hits in, recomputation out), step times
exist on ours and TGI only, and the step shares and slot_utilization on ours only (no
per-step active ratios).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepserve.config.urls import check_http_url
from stepserve.host.cpu_metrics import cpu_window
from stepserve.host.cpu_share import CPU_KEYS
from stepserve.metrics.bounded_scrape import LiveScrapeError, ScrapeLimits, fetch_snapshot
from stepserve.metrics.percentiles import percentile, ratio
from stepserve.metrics.prometheus import (
    HISTOGRAMS,
    LEVELS,
    Snapshot,
    counter_delta,
    counter_delta_by_reason,
    histogram_delta,
)
from stepserve.metrics.quantile_bounds import bounds_entry, is_wide
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import queue_fields

WINDOW_S = 10.0
INTERVAL_S = 1.0

LIVE_KEYS = (
    "window_s", "scrape_samples", "metrics_source",
    "waiting_max", "waiting_p50", "waiting_nonzero_share", "waiting_growth",
    "waiting_trend_rise", "waiting_monotonic_rise", "waiting_monotonic_rise_s",
    "waiting_by_reason_max", "waiting_by_reason_p50",
    "running_max", "in_engine_max", "kv_usage_max",
    "preemptions", "requests_total", "requests_finished", "requests_rejected",
    "rejected_by_reason", "prompt_tokens", "generation_tokens",
    "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "tpot_p50_s", "tpot_p99_s",
    "itl_p50_s", "itl_p99_s",
    "p99_p50_ttft_ratio", "p99_p50_e2e_ratio", "p99_p50_tpot_ratio", "quantile_bounds",
    "prefill_token_share", "mean_step_s", "step_p50_s", "step_p99_s",
    "steps", "prefill_step_share", "zero_decode_step_share",
    "slot_utilization",
    *CPU_KEYS,
)
# each quantile key: (histogram, q)
QUANTILES = {f"{key}_p{round(100 * q)}_s": (hist, q)
             for key, hist in (("ttft", "ttft"), ("e2e", "e2e"), ("tpot", "tpot"),
                               ("itl", "itl"), ("step", "step_time"))
             for q in (0.5, 0.99)}


def metrics_url(url: str) -> str:
    """`http://HOST:PORT` (or one already ending in /metrics) to its /metrics URL;
    UsageError naming --url when it is not an http(s) URL."""
    url = check_http_url("--url", url)
    return url if url.endswith("/metrics") else url + "/metrics"


@dataclass(kw_only=True)
class ScrapeWindow:
    """The scrapes of a window that worked, in time order, and one line per one that
    failed (skipped); `error`: the last failure. bench/loadgen.py's Scraper is one too."""

    snapshots: list[Snapshot] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    attempts: int = 0
    error: LiveScrapeError | None = None

    async def scrape(self, client: httpx.AsyncClient, url: str,
                     limits: ScrapeLimits | None = None) -> Snapshot | None:
        """One scrape into the window; None (and a line in `failures`) when it failed."""
        self.attempts += 1
        try:
            snap = await fetch_snapshot(client, url, limits)
        except LiveScrapeError as e:
            self.failures.append(f"scrape {self.attempts}: {e}")
            self.error = e
            return None
        self.snapshots.append(snap)
        return snap

    async def first(self, client: httpx.AsyncClient, url: str,
                    limits: ScrapeLimits | None = None) -> bool:
        """The first scrape, retried once at once; False when both failed (a target that
        is not there is reported without waiting out the window)."""
        for _ in range(2):
            if await self.scrape(client, url, limits) is not None:
                return True
        return False


def scrape_window(url: str, window_s: float = WINDOW_S, interval_s: float = INTERVAL_S
                  ) -> ScrapeWindow:
    """Scrapes evenly spread over `window_s`, about every `interval_s`, at least two (the
    first at once, the last at the window's end); LiveScrapeError when fewer than two
    worked (failed ones are skipped, the first retried once: see ScrapeWindow)."""
    if window_s <= 0 or interval_s <= 0:
        raise LiveScrapeError(f"window {window_s:g} s, interval {interval_s:g} s: both must "
                              "be positive")
    target = metrics_url(url)
    n = max(2, round(window_s / interval_s) + 1)
    out = asyncio.run(_scrape_window(target, window_s, n))
    if len(out.snapshots) < 2:
        raise LiveScrapeError(f"only {len(out.snapshots)} of {out.attempts} scrapes of "
                              f"{target} worked; a window needs two. {out.failures[-1]}")
    return out


async def _scrape_window(target: str, window_s: float, n: int) -> ScrapeWindow:
    out = ScrapeWindow()
    async with httpx.AsyncClient() as client:
        t0 = time.monotonic()
        for i in range(n):
            wait = t0 + window_s * i / (n - 1) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if i:
                await out.scrape(client, target)
            elif not await out.first(client, target):
                assert out.error is not None
                raise out.error
    return out


def level_summary(snapshots: Sequence[Snapshot]) -> dict[str, Any]:
    """The level fields (waiting_*, running_max, in_engine_max, kv_usage_max) of a series
    of scrapes in time order, by name (bench/loadgen.py picks the ones it reports)."""
    out: dict[str, Any] = {}
    for key in LEVELS:
        vals = [v for s in snapshots if (v := s.level(key)) is not None]
        out[f"{key}_max"] = max(vals) if vals else None
    queue = [(s.t_s, v) for s in snapshots if (v := s.level("waiting")) is not None]
    ts, levels = [t for t, _ in queue], [v for _, v in queue]
    out.update(queue_fields(ts, levels, (ts[0], ts[-1]) if ts else None))
    both = [(w, r) for s in snapshots
            if (w := s.level("waiting")) is not None and (r := s.level("running")) is not None]
    out["in_engine_max"] = max((w + r for w, r in both), default=None)
    by_reason: dict[str, list[float]] = {}
    for s in snapshots:
        for reason, v in (s.by_reason("waiting_by_reason") or {}).items():
            by_reason.setdefault(reason, []).append(v)
    out["waiting_by_reason_max"] = {r: max(vs) for r, vs in by_reason.items()} or None
    out["waiting_by_reason_p50"] = {r: percentile(vs, 50) for r, vs in by_reason.items()} \
        or None
    return out


def live_summary(snapshots: Sequence[Snapshot]) -> RunSummary:
    """The LIVE_KEYS fields from scrapes in time order (first and last bound the window)."""
    out: dict[str, Any] = dict.fromkeys(LIVE_KEYS)
    out["scrape_samples"] = len(snapshots)
    if len(snapshots) >= 2 and (source := snapshots[0].source()) is not None:
        out.update(_window_values(source.name, snapshots[0], snapshots[-1]))
        out.update(level_summary(snapshots))
    return RunSummary.of(**{key: out[key] for key in LIVE_KEYS})


def _window_values(source: str, first: Snapshot, last: Snapshot) -> dict[str, Any]:
    """The counter and histogram keys: increases from `first` to `last`."""

    def delta(key: str) -> float | None:
        return counter_delta(first, last, key)

    hist = {key: histogram_delta(first, last, key) for key in HISTOGRAMS}
    quantiles: dict[str, float | None] = {}
    bounds: dict[str, dict[str, float | None]] = {}
    for name, (key, q) in QUANTILES.items():
        found = None if hist[key] is None else hist[key].quantile_in(q)
        quantiles[name] = None if found is None else found.value
        if found is not None and is_wide(found):
            bounds[name] = bounds_entry(found)

    prompt, generation = delta("prompt_tokens"), delta("generation_tokens")
    finished = delta("requests_finished")
    if finished is None and hist["e2e"] is not None:
        finished = hist["e2e"].count
    ended, rejected = delta("requests_ended"), delta("rejected")
    steps = delta("steps")
    out = {"metrics_source": source, "window_s": last.t_s - first.t_s,
           "preemptions": delta("preemptions"), "requests_finished": finished,
           "requests_total": None if ended is None else ended + (rejected or 0.0),
           "requests_rejected": rejected,
           "rejected_by_reason": counter_delta_by_reason(first, last, "rejected"),
           "prompt_tokens": prompt, "generation_tokens": generation,
           "prefill_token_share": None if prompt is None or generation is None
           else ratio(prompt, prompt + generation),
           **quantiles, "quantile_bounds": bounds,
           "mean_step_s": None if hist["step_time"] is None else hist["step_time"].mean,
           "steps": steps, "prefill_step_share": ratio(delta("prefill_only_steps"), steps),
           "zero_decode_step_share": ratio(delta("zero_decode_steps"), steps),
           "slot_utilization": ratio(delta("active_sequence_steps"), delta("held_slot_steps")),
           **cpu_window(first, last)}
    for key in ("ttft", "e2e", "tpot"):
        p50, p99 = quantiles[f"{key}_p50_s"], quantiles[f"{key}_p99_s"]
        out[f"p99_p50_{key}_ratio"] = p99 / p50 if p50 and p99 is not None else None
    return out


def live_config(snapshot: Snapshot) -> dict[str, Any]:
    """The scheduler settings a server publishes in an info gauge (ours:
    stepserve:scheduler_config_info), numbers as ints; {} where it publishes none."""
    return {k: int(v) if v.lstrip("-").isdigit() else v
            for k, v in (snapshot.info() or {}).items()}


def non_finite_series(snapshots: Sequence[Snapshot]) -> list[str]:
    """The series some scrape of the window held as NaN or infinity (read as missing)."""
    return sorted({name for s in snapshots for name in s.non_finite})


def window_notes(summary: RunSummary, unevaluable: dict[str, list[str]],
                 failures: Sequence[str] = (), non_finite: Sequence[str] = ()) -> list[str]:
    """What the window saw and what it could not (`failures`: the scrapes that failed
    and were skipped; `non_finite`: series read as missing), for the text report."""
    finished = summary.requests_finished
    seen = "requests finished: unknown" if finished is None else \
        f"{finished:g} requests finished"
    lines = [f"  window: {summary.scrape_samples} scrapes over "
             f"{summary.window_s or 0:.1f} s of {summary.metrics_source} metrics; "
             f"{seen}"]
    peaks, medians = summary.waiting_by_reason_max, summary.waiting_by_reason_p50 or {}
    if peaks:
        shown = "; ".join(f"{reason} peak {v:g}, median {medians.get(reason, 0):g}"
                          for reason, v in peaks.items())
        lines.append(f"  waiting by reason: {shown} (capacity: waiting for a batch slot or "
                     "KV blocks; deferred: held back by a passing constraint, such as a LoRA "
                     "budget or a KV transfer)")
    if failures:
        lines.append(f"  {len(failures)} scrape(s) failed and were skipped; the first: "
                     f"{failures[0]}")
    if non_finite:
        shown = ", ".join(non_finite[:5]) + (f" and {len(non_finite) - 5} more"
                                             if len(non_finite) > 5 else "")
        lines.append(f"  {len(non_finite)} series held NaN or infinite values, read as "
                     f"missing: {shown}")
    if not finished:
        lines.append("  no request finished in the window: no latency quantiles")
    if unevaluable:
        missing = "; ".join(f"{rule} (needs {', '.join(needs)})"
                            for rule, needs in unevaluable.items())
        lines.append(f"  not evaluable for lack of data: {missing}")
    return lines


def pool_windows(snapshots: Sequence[Snapshot]) -> dict[str, list[Snapshot]]:
    """Each pool's part of a window, by the `pool` label a cluster ingress puts on every
    series; {} for a server without pools."""
    names = sorted({value for (_, labels) in snapshots[-1].samples for key, value in labels
                    if key == "pool"}) if snapshots else []
    return {name: [Snapshot(s.t_s, {k: v for k, v in s.samples.items()
                                    if ("pool", name) in k[1]}, s.non_finite)
                   for s in snapshots]
            for name in names}
