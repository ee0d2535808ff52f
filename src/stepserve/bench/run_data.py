"""Per-run plot data from a bench run, of the types `stepserve report` reads (as
metrics.run_data.measure_run gives a simulation):

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

from stepserve.bench.client import RequestRecord
from stepserve.bench.results import e2e_s, ttft_s
from stepserve.bench.scrape import Snapshot
from stepserve.metrics.prometheus import counter_delta
from stepserve.metrics.run_data import SAMPLE_CAP, LatencySamples, sample_set
from stepserve.metrics.step_metrics import TimeSeries

# timeseries field -> the counter it is the per-interval increase of
INTERVAL_COUNTERS = {"preemptions": "preemptions", "prefill_tokens": "prompt_tokens",
                     "decode_tokens": "generation_tokens", "steps": "steps"}


def latency_samples(records: Sequence[RequestRecord], cap: int = SAMPLE_CAP
                    ) -> LatencySamples:
    done = [r for r in records if r.ok and not r.warmup]
    ttft = [v for r in done if (v := ttft_s(r)) is not None]
    e2e = [v for r in done if (v := e2e_s(r)) is not None]
    return sample_set(ttft, e2e, len(done), cap)


def scrape_timeseries(snapshots: Sequence[Snapshot]) -> TimeSeries | None:
    """The sampled levels and per-interval counter increases; None with under 2 samples.
    A counter the target does not expose is left out (`steps`) or reads 0."""
    if len(snapshots) < 2:
        return None
    t0 = snapshots[0].t_s
    # the first row is the sample before the load (levels as seen, no increase yet)
    rows = [(snapshots[0], snapshots[0])] + list(zip(snapshots, snapshots[1:], strict=False))

    def level(key: str) -> list[float]:
        return [b.level(key) or 0.0 for _a, b in rows]

    def increase(field: str) -> list[float | None]:
        return [counter_delta(a, b, INTERVAL_COUNTERS[field]) for a, b in rows]

    def counted(field: str) -> list[float]:
        return [d or 0.0 for d in increase(field)]

    steps = increase("steps")
    return TimeSeries(t=[b.t_s - t0 for _a, b in rows], waiting=level("waiting"),
                      running=level("running"), kv_usage=None,
                      prefill_tokens=counted("prefill_tokens"),
                      decode_tokens=counted("decode_tokens"), preemptions=counted("preemptions"),
                      steps=None if all(d is None for d in steps) else [d or 0.0 for d in steps])


def http_extras(records: Sequence[RequestRecord], snapshots: Sequence[Snapshot]
                ) -> tuple[LatencySamples, TimeSeries | None]:
    """(latency samples, the /metrics time series or None) of a run against a target."""
    return latency_samples(records), scrape_timeseries(snapshots)
