"""A target's `/metrics`, sampled during a bench run.

The Prometheus text and each server's names (ours, vLLM, SGLang, TGI) are read by
metrics/prometheus.py; `Snapshot.level("waiting" | "running" | "kv_usage")` and
`Snapshot.counter(...)` give the same signal whatever the target.

Summary keys (None where the target exposes no such series):
  waiting_max, running_max, kv_usage_max (0..1): highest sampled level;
  preemptions: counter delta over the run; server_requests_finished (stop + length),
  server_generation_tokens, server_prompt_tokens: counter deltas;
  waiting_p50, waiting_nonzero_share (share of samples with a queue), waiting_growth
  (least-squares slope of the sampled queue, requests/s) and waiting_trend_rise (that
  slope times the sampled window), named as in metrics/summary.py so the doctor's
  queue rules read them; metrics_source ("stepserve", "vllm", "sglang", "tgi" or None),
  scrape_samples; mean_step_s, step_p50_s, step_p99_s: the engine's step time over the
  run, from its step-time histogram (ours and TGI's; vLLM and SGLang publish none).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from stepserve.metrics.live import level_summary
from stepserve.metrics.prom_sources import KNOWN_PREFIXES
from stepserve.metrics.prometheus import (
    Samples,
    Snapshot,
    counter_delta,
    histogram_delta,
    parse_prometheus,
)

__all__ = ["SCRAPE_KEYS", "Samples", "Scraper", "Snapshot", "parse_prometheus",
           "scrape_summary"]

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
class Scraper:
    """Polls `url` every `interval_s` until stopped; keeps every snapshot."""

    url: str
    interval_s: float = 0.5
    snapshots: list[Snapshot] = field(default_factory=list)
    error: str | None = None

    async def scrape_once(self, client: httpx.AsyncClient) -> Snapshot | None:
        try:
            resp = await client.get(self.url, timeout=5.0)
        except httpx.HTTPError as e:
            self.error = f"{type(e).__name__}: {e}"
            return None
        if resp.status_code != 200:
            self.error = f"HTTP {resp.status_code}"
            return None
        snap = Snapshot(time.perf_counter(), parse_prometheus(resp.text))
        if snap.source() is None:
            self.error = f"no series with a known prefix ({KNOWN_PREFIXES})"
            return None
        self.snapshots.append(snap)
        return snap

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                await self.scrape_once(client)

    def summary(self) -> dict:
        return scrape_summary(self.snapshots)


def scrape_summary(snapshots: list[Snapshot]) -> dict:
    """The SCRAPE_KEYS from snapshots in time order (first = before the run, last = after)."""
    out: dict = {k: None for k in SCRAPE_KEYS}
    out["scrape_samples"] = len(snapshots)
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
    return out
