"""Prometheus text from a target's `/metrics`, sampled during a run.

Names are read under our prefix (`stepserve:`) or vLLM's (`vllm:`), whichever the target
exposes; counters may carry the `_total` suffix (prometheus_client adds it). Values of
one name are summed over label sets (several models, finish reasons).

Summary keys (None where the target exposes no such series):
  waiting_max, running_max, kv_usage_max (0..1): highest sampled level;
  preemptions: counter delta over the run; server_requests_finished (stop + length),
  server_generation_tokens, server_prompt_tokens: counter deltas;
  waiting_p50, waiting_nonzero_share (share of samples with a queue), waiting_growth
  (least-squares slope of the sampled queue, requests/s) and waiting_trend_rise (that
  slope times the sampled window), named as in metrics/summary.py so the doctor's
  queue rules read them; metrics_source ("stepserve", "vllm" or None), scrape_samples.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import httpx

from stepserve.metrics.percentiles import least_squares_slope, percentile

PREFIXES = ("stepserve:", "vllm:")
LEVELS = {"waiting": "num_requests_waiting", "running": "num_requests_running",
          "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc")}
COUNTERS = {"preemptions": "num_preemptions", "generation_tokens": "generation_tokens",
            "prompt_tokens": "prompt_tokens"}
SCRAPE_KEYS = ("waiting_max", "running_max", "kv_usage_max", "preemptions",
               "waiting_p50", "waiting_nonzero_share", "waiting_growth", "waiting_trend_rise",
               "server_requests_finished", "server_generation_tokens",
               "server_prompt_tokens", "metrics_source", "scrape_samples")

Samples = dict[tuple[str, frozenset], float]


def parse_prometheus(text: str) -> Samples:
    """{(name, frozenset of (label, value)): value}; comments and bad lines skipped."""
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "}" in line:
            key, _, rest = line.rpartition("}")
            name, _, labels_text = key.partition("{")
            value_text = rest.split()[0] if rest.split() else ""
            labels = frozenset(_labels(labels_text))
        else:
            parts = line.split()
            if len(parts) < 2:
                continue
            name, value_text, labels = parts[0], parts[1], frozenset()
        try:
            out[(name.strip(), labels)] = float(value_text)
        except ValueError:
            continue
    return out


def _labels(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in text.split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            pairs.append((k.strip(), v.strip().strip('"')))
    return pairs


@dataclass
class Snapshot:
    """One scrape, reduced to the series the bench reports."""

    t_s: float
    samples: Samples

    def prefix(self) -> str | None:
        names = {n for n, _ in self.samples}
        return next((p for p in PREFIXES if any(n.startswith(p) for n in names)), None)

    def value(self, prefix: str, *names: str, finished_only: bool = False) -> float | None:
        """Sum over label sets of the first name present (with or without _total)."""
        for base in names:
            for name in (prefix + base, prefix + base + "_total"):
                vals = [v for (n, ls), v in self.samples.items() if n == name
                        and (not finished_only or dict(ls).get("finished_reason")
                             in ("stop", "length"))]
                if vals:
                    return sum(vals)
        return None


@dataclass
class Scraper:
    """Polls `url` every `interval_s` until stopped; keeps the first and last snapshot
    and every level sample."""

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
        if snap.prefix() is None:
            self.error = "no stepserve: or vllm: series"
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
    if not snapshots:
        return out
    prefix = snapshots[0].prefix()
    if prefix is None:
        return out
    out["metrics_source"] = prefix.rstrip(":")
    for key, names in LEVELS.items():
        names = (names,) if isinstance(names, str) else names
        vals = [v for s in snapshots if (v := s.value(prefix, *names)) is not None
                and not math.isnan(v)]
        out[f"{key}_max"] = max(vals) if vals else None
    queue = [(snap.t_s, v) for snap in snapshots
             if (v := snap.value(prefix, LEVELS["waiting"])) is not None]
    if queue:
        levels = [v for _, v in queue]
        out["waiting_p50"] = percentile(levels, 50)
        out["waiting_nonzero_share"] = sum(1 for v in levels if v > 0) / len(levels)
        slope = least_squares_slope([t for t, _ in queue], levels)
        out["waiting_growth"] = slope
        if slope is not None:
            out["waiting_trend_rise"] = slope * (queue[-1][0] - queue[0][0])
    first, last = snapshots[0], snapshots[-1]

    def delta(*names: str, finished_only: bool = False) -> float | None:
        a = first.value(prefix, *names, finished_only=finished_only)
        b = last.value(prefix, *names, finished_only=finished_only)
        return None if a is None or b is None else b - a

    out["preemptions"] = delta(COUNTERS["preemptions"])
    out["server_generation_tokens"] = delta(COUNTERS["generation_tokens"])
    out["server_prompt_tokens"] = delta(COUNTERS["prompt_tokens"])
    out["server_requests_finished"] = delta("request_success", finished_only=True)
    return out
