"""A target's `/metrics`, sampled during a bench run (each server's names, ours, vLLM,
SGLang, TGI, read by metrics/prometheus.py).

The summary keys (None where the target exposes no such series): the highest sampled
levels, the counters' increases over the run, the queue's shape named as in
metrics/summary.py so the doctor's queue rules read them (waiting_p50,
waiting_nonzero_share, waiting_growth: the least-squares slope in requests/s,
waiting_trend_rise: that slope times the window), and the step time from the engine's
step-time histogram (ours and TGI's). A failed scrape is skipped and counted, never
fatal, as `doctor --url` does (both read through metrics/bounded_scrape.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from stepserve.host.cpu_metrics import cpu_window
from stepserve.metrics.bounded_scrape import ScrapeLimits
from stepserve.metrics.live_window import ScrapeWindow, level_summary
from stepserve.metrics.prometheus import Snapshot, counter_delta, histogram_delta

SCRAPE_KEYS = ("waiting_max", "running_max", "kv_usage_max", "preemptions",
               "waiting_p50", "waiting_nonzero_share", "waiting_growth", "waiting_trend_rise",
               "server_requests_finished", "server_generation_tokens",
               "server_prompt_tokens", "mean_step_s", "step_p50_s", "step_p99_s",
               "metrics_source", "scrape_samples")  # the two not numbers last
# summary key -> the counter whose increase over the run it is
_COUNTER_KEYS = {"preemptions": "preemptions", "server_requests_finished": "requests_finished",
                 "server_generation_tokens": "generation_tokens",
                 "server_prompt_tokens": "prompt_tokens"}


@dataclass
class Scraper(ScrapeWindow):
    """Polls `url` every `interval_s` until stopped; keeps every snapshot that worked and
    one line per scrape that failed."""

    url: str
    interval_s: float = 0.5
    limits: ScrapeLimits | None = None  # None: bounded_scrape.SCRAPE_LIMITS

    async def scrape_once(self, client: httpx.AsyncClient) -> Snapshot | None:
        """One scrape; None (and a line in `failures`) when it failed."""
        return await self.scrape(client, self.url, self.limits)

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                await self.scrape_once(client)

    def summary(self) -> dict:
        return scrape_summary(self.snapshots, self.failures)


def scrape_summary(snapshots: list[Snapshot], failures: Sequence[str] = ()) -> dict:
    """The SCRAPE_KEYS from snapshots in time order (first = before the run, last = after),
    and scrape_failures / scrape_error when some of `failures` (lines) are there."""
    out: dict = {k: None for k in SCRAPE_KEYS}
    out["scrape_samples"] = len(snapshots)
    if failures:
        out.update(scrape_failures=len(failures), scrape_error=failures[0])
    if not snapshots or (source := snapshots[0].source()) is None:
        return out
    out["metrics_source"] = source.name
    levels = level_summary(snapshots)
    out.update({k: v for k, v in levels.items() if k in out})
    first, last = snapshots[0], snapshots[-1]
    for key, counter in _COUNTER_KEYS.items():
        out[key] = counter_delta(first, last, counter)
    step_time = histogram_delta(first, last, "step_time")
    if step_time is not None and step_time.count:
        out.update(mean_step_s=step_time.mean, step_p50_s=step_time.quantile(0.5),
                   step_p99_s=step_time.quantile(0.99))
    if (cpu := cpu_window(first, last))["cpu_source"] is not None:
        out.update(cpu)  # the server's CPU sharing (host/cpu_metrics.py)
    return out
