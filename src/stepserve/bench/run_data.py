"""Per-run plot data from a bench run, in the shape `stepserve report` reads (the same
keys as metrics.run_data.run_extras gives a simulation):

  latency_samples: TTFT and E2E of the completed, measured requests (client clock), thinned
      to SAMPLE_CAP order statistics;
  timeseries: one row per /metrics sample of the target, t in seconds from the first
      (taken before the load): waiting and running (levels), and per interval since the
      previous sample
      the preemptions, prompt tokens (as prefill_tokens), generation tokens (as
      decode_tokens) and, where the target counts them (stepserve:steps), engine steps.
      Without /metrics samples there is no timeseries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepserve.bench.client import RequestRecord
from stepserve.bench.results import e2e_s, ttft_s
from stepserve.bench.scrape import Snapshot
from stepserve.metrics.prometheus import counter_delta
from stepserve.metrics.run_data import SAMPLE_CAP, sample_set

# timeseries field -> the counter it is the per-interval increase of
INTERVAL_COUNTERS = {"preemptions": "preemptions", "prefill_tokens": "prompt_tokens",
                     "decode_tokens": "generation_tokens", "steps": "steps"}


def latency_samples(records: Sequence[RequestRecord], cap: int = SAMPLE_CAP) -> dict:
    done = [r for r in records if r.ok and not r.warmup]
    ttft = [v for r in done if (v := ttft_s(r)) is not None]
    e2e = [v for r in done if (v := e2e_s(r)) is not None]
    return sample_set(ttft, e2e, len(done), cap)


def scrape_timeseries(snapshots: Sequence[Snapshot]) -> dict[str, list] | None:
    """The sampled levels and per-interval counter increases; None with under 2 samples.
    A counter the target does not expose is left out (`steps`) or reads 0."""
    if len(snapshots) < 2:
        return None
    t0 = snapshots[0].t_s
    # the first row is the sample before the load (levels as seen, no increase yet)
    rows = [(snapshots[0], snapshots[0])] + list(zip(snapshots, snapshots[1:], strict=False))
    ts: dict[str, list] = {"t": [b.t_s - t0 for _a, b in rows]}
    for key in ("waiting", "running"):
        ts[key] = [b.level(key) or 0.0 for _a, b in rows]
    for field, counter in INTERVAL_COUNTERS.items():
        deltas = [counter_delta(a, b, counter) for a, b in rows]
        if field == "steps" and all(d is None for d in deltas):
            continue
        ts[field] = [d or 0.0 for d in deltas]
    return ts


def http_extras(records: Sequence[RequestRecord],
                snapshots: Sequence[Snapshot]) -> dict[str, Any]:
    out: dict[str, Any] = {"latency_samples": latency_samples(records)}
    ts = scrape_timeseries(snapshots)
    if ts is not None:
        out["timeseries"] = ts
    return out
