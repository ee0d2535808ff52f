"""Prometheus text from a server's `/metrics`, read the same way whatever the server.

`parse_prometheus` turns the text format into {(name, labels): value}, through
prometheus_client's own parser (label values with commas, escaped quotes and newlines
survive). A `Source` names,
for one kind of server, the series behind each signal the bench and the doctor read:

  levels (gauges, read as they are): waiting, running, kv_usage (0..1);
  counters (read as increases between two scrapes): preemptions, prompt_tokens,
      generation_tokens, requests_finished (stop or length), steps, and our own
      prefill_only_steps, zero_decode_steps, active_sequence_steps, held_slot_steps;
  histograms (bucket increases between two scrapes): ttft, e2e, tpot (or the inter-token
      latency where a server has no per-request TPOT), step_time.

A key a server has no series for is simply absent from its maps: readers get None. Values
of one name are summed over label sets (models, engines, methods); a counter may or may
not carry the `_total` suffix (prometheus_client adds it, the TGI router does not); of
several names for one key, the first one present wins (so an old server still reads).

The sources and their names live in prom_sources.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from stepserve.core.end_reasons import COMPLETED_REASONS
from stepserve.metrics.prom_sources import SOURCES, Source

Samples = dict[tuple[str, frozenset], float]


def parse_prometheus(text: str) -> Samples:
    """{(sample name, frozenset of (label, value)): value}. The strict parser refuses a
    whole text for one bad line; then each line is read alone and bad ones skipped, so
    one odd series does not blind a reader to the rest. (prometheus_client's parser
    raises IndexError, not ValueError, on some garbage: both are a bad text.)"""
    try:
        return _samples(text)
    except (ValueError, IndexError):
        pass
    out: Samples = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                out.update(_samples(line + "\n"))
            except (ValueError, IndexError):
                continue
    return out


def count_samples(text: str) -> int:
    """How many sample lines (series) `text` holds: lines neither blank nor comments."""
    return sum(1 for line in text.split("\n")
               if line.strip() and not line.lstrip().startswith("#"))


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def detect_source(samples: Samples) -> Source | None:
    """The first source whose prefix some series carries (ours before vLLM's)."""
    names = {n for n, _ in samples}
    return next((s for s in SOURCES if any(n.startswith(s.prefix) for n in names)), None)


def _completed(labels: frozenset) -> bool:
    reason = dict(labels).get("finished_reason")
    return reason is None or reason in COMPLETED_REASONS


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (upper bound, count), sorted, +Inf last when present, with
    the histogram's sum and count. Summed over label sets."""

    buckets: tuple[tuple[float, float], ...]
    sum: float | None
    count: float | None

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since `earlier` (bucket by bucket; a bound missing from
        either side is dropped)."""
        before = dict(earlier.buckets)
        buckets = tuple((le, c - before[le]) for le, c in self.buckets if le in before)
        return Histogram(buckets, _sub(self.sum, earlier.sum), _sub(self.count, earlier.count))

    def quantile(self, q: float) -> float | None:
        return bucket_quantile(q, self.buckets)

    @property
    def mean(self) -> float | None:
        if self.sum is None or not self.count:
            return None
        return self.sum / self.count


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets as Prometheus' histogram_quantile computes it:
    find the bucket holding rank q x total, interpolate linearly inside it (from 0 for
    the first bucket), and answer the highest finite bound when the rank falls in +Inf.
    None without a +Inf bucket, with under two buckets, or with no observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q = {q}: must be within 0..1")
    bs = sorted(buckets)
    if len(bs) < 2 or bs[-1][0] != math.inf:
        return None
    # Cumulative counts must not fall; a scrape racing an observation can break that
    # slightly, and Prometheus evens it out the same way.
    counts = list(itertools.accumulate((c for _, c in bs), max))
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank and c > 0)
    if b == len(bs) - 1:
        return bs[-2][0]
    upper = bs[b][0]
    if b == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = bs[b - 1][0], counts[b - 1]
    return lower + (upper - lower) * (rank - below) / (counts[b] - below)


@dataclass
class Snapshot:
    """One scrape of `/metrics`: when (a monotonic clock, seconds) and what it held."""

    t_s: float
    samples: Samples
    _source: Source | None = field(default=None, init=False, repr=False, compare=False)
    _looked: bool = field(default=False, init=False, repr=False, compare=False)

    def source(self) -> Source | None:
        if not self._looked:
            self._source, self._looked = detect_source(self.samples), True
        return self._source

    def _sum(self, name: str, keep: Callable[[frozenset], bool] | None = None
             ) -> float | None:
        vals = [v for (n, ls), v in self.samples.items() if n == name
                and not math.isnan(v) and (keep is None or keep(ls))]
        return sum(vals) if vals else None

    def level(self, key: str) -> float | None:
        """waiting, running or kv_usage (0..1) now, summed over label sets; None where the
        source has no such series."""
        src = self.source()
        if src is None:
            return None
        for base in src.levels.get(key, ()):
            if (v := self._sum(src.prefix + base)) is not None:
                return v
        return None

    def counter(self, key: str) -> float | None:
        """A counter's value (one of COUNTERS), with or without `_total`."""
        src = self.source()
        if src is None:
            return None
        keep = _completed if key == "requests_finished" else None
        for base in src.counters.get(key, ()):
            for name in (src.prefix + base, src.prefix + base + "_total"):
                if (v := self._sum(name, keep)) is not None:
                    return v
        return None

    def histogram(self, key: str) -> Histogram | None:
        """A histogram (one of HISTOGRAMS), buckets summed over label sets."""
        src = self.source()
        if src is None:
            return None
        for base in src.histograms.get(key, ()):
            name = src.prefix + base
            per_le: dict[float, float] = {}
            for (n, ls), v in self.samples.items():
                if n == name + "_bucket" and (bound := _bound(dict(ls).get("le"))) is not None:
                    per_le[bound] = per_le.get(bound, 0.0) + v
            count = self._sum(name + "_count")
            if per_le or count is not None:
                return Histogram(tuple(sorted(per_le.items())), self._sum(name + "_sum"),
                                 count)
        return None

    def info(self) -> dict[str, str] | None:
        """The labels of the source's config info gauge (model_name and engine left
        out)."""
        src = self.source()
        if src is None or src.config_info is None:
            return None
        name = src.prefix + src.config_info
        for (n, ls), _v in self.samples.items():
            if n == name:
                return {k: v for k, v in ls if k not in ("model_name", "engine")}
        return None


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound (`le`), None when it is not a number."""
    try:
        return None if le is None else float(le)  # float() reads "+Inf" too
    except ValueError:
        return None


def counter_delta(before: Snapshot, after: Snapshot, key: str) -> float | None:
    """The counter's increase from `before` to `after`; None where either lacks it. A
    value that fell means the server restarted in between: as Prometheus' increase()
    does, the later value is then the increase since the restart."""
    a, b = before.counter(key), after.counter(key)
    if a is None or b is None:
        return None
    return b - a if b >= a else b


def histogram_delta(before: Snapshot, after: Snapshot, key: str) -> Histogram | None:
    """What the histogram observed from `before` to `after` (None where either lacks it,
    or after a restart: the buckets before it are gone)."""
    a, b = before.histogram(key), after.histogram(key)
    if a is None or b is None:
        return None
    delta = b.minus(a)
    if delta.count is not None and delta.count < 0:
        return None
    return delta
