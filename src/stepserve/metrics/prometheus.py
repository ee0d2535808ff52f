"""Prometheus text from a server's `/metrics`, read the same way whatever the server.

A `Source` names, for one kind of server, the series behind each signal (LEVELS: gauges;
COUNTERS and HISTOGRAMS: increases between two scrapes); a key it has no series for reads
as None. Values are summed over label sets; a counter may lack `_total` (TGI's router);
of several names for one key the first present wins (so an old server still reads).

Some series are split by a `reason` label that the doctor keeps apart (BY_REASON): the
rejections (ours: request_rejected; vLLM: admission_rejections, its queue caps
max_num_queued_reqs and max_num_queued_tokens) and vLLM's waiting queue by why it waits
(capacity or deferred).

Where the names come from: stepserve's server/metrics.py; vLLM's v1/metrics/loggers.py
(gpu_cache_usage_perc before 0.9; iteration_tokens_total's _count counts steps; the ITL
was time_per_output_token_seconds until inter_token_latency_seconds replaced it, and
request_time_per_output_token_seconds is each request's TPOT); SGLang's
srt/metrics/collector.py (retractions are its preemption; counters count at a request's
finish); TGI's router metrics (token counts are per-request histograms, batch_inference_*
count forward passes; no TTFT, KV usage or preemptions); llama.cpp's llama-server with
`--metrics` (its README: requests_processing and requests_deferred are gauges, the
running slots and the requests waiting for one; n_decode_total counts llama_decode()
calls, its steps; kv_cache_usage_ratio, kv_cache_tokens; no histograms).

Two more keys serve `profile --target` (profile/server_facts.py): `iteration_tokens`
(tokens computed per step: the largest iteration bounds the step token budget, its sum
the tokens a probe made the engine compute) and `prefix_cache_hits` (prompt tokens the
prefix cache served); `cache_info` names the info gauge whose labels are the KV cache's
settings (block_size, num_gpu_blocks, enable_prefix_caching).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from prometheus_client.parser import text_string_to_metric_families

from stepserve.core.end_reasons import COMPLETED_REASONS

LEVELS = ("waiting", "running", "kv_usage")
# requests_finished: stop or length; requests_ended: any finish reason; rejected: refused
# at admission, never held by the engine (so counted apart from the ended)
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens", "requests_finished",
            "requests_ended", "rejected", "steps", "prefill_only_steps", "zero_decode_steps",
            "active_sequence_steps", "held_slot_steps", "prefix_cache_hits")
HISTOGRAMS = ("ttft", "e2e", "tpot", "itl", "step_time", "iteration_tokens")
# the series also read split by their `reason` label: {key: its kind}
BY_REASON = {"rejected": "counters", "waiting_by_reason": "levels"}
REASON = "reason"


@dataclass(frozen=True)
class Source:
    """One kind of server: its name prefix and, per signal, the names to try in order
    (without the prefix)."""

    name: str
    prefix: str
    levels: Mapping[str, tuple[str, ...]]
    counters: Mapping[str, tuple[str, ...]]
    histograms: Mapping[str, tuple[str, ...]]
    config_info: str | None = None  # an info gauge whose labels are scheduler settings
    cache_info: str | None = None  # an info gauge whose labels are KV cache settings
    # counters whose labelled children appear at their first count (ours: a reject
    # reason), so a scrape with none of them has counted none
    absent_is_zero: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        split_levels = tuple(k for k, kind in BY_REASON.items() if kind == "levels")
        for kind, keys, known in (("levels", self.levels, (*LEVELS, *split_levels)),
                                  ("counters", self.counters, COUNTERS),
                                  ("histograms", self.histograms, HISTOGRAMS)):
            unknown = set(keys) - set(known)
            if unknown:
                raise ValueError(f"Source {self.name}: unknown {kind} {sorted(unknown)}")


# the names vLLM introduced, which ours and SGLang's keep
_TOKENS = {"prompt_tokens": ("prompt_tokens",), "generation_tokens": ("generation_tokens",)}
_TTFT_E2E = {"ttft": ("time_to_first_token_seconds",),
             "e2e": ("e2e_request_latency_seconds",)}

_SUCCESS = {"requests_finished": ("request_success",), "requests_ended": ("request_success",)}

STEPSERVE = Source(
    "stepserve", "stepserve:",
    levels={"waiting": ("num_requests_waiting",), "running": ("num_requests_running",),
            "kv_usage": ("kv_cache_usage_perc",)},
    counters={"preemptions": ("num_preemptions",), **_TOKENS, **_SUCCESS,
              "rejected": ("request_rejected",), "steps": ("steps",),
              "prefix_cache_hits": ("prefix_cache_hits",),
              **{key: (key,) for key in ("prefill_only_steps", "zero_decode_steps",
                                         "active_sequence_steps", "held_slot_steps")}},
    histograms={**_TTFT_E2E, "tpot": ("request_time_per_output_token_seconds",),
                "itl": ("inter_token_latency_seconds",),
                "step_time": ("step_duration_seconds",),
                "iteration_tokens": ("iteration_tokens_total",)},
    config_info="scheduler_config_info", cache_info="cache_config_info",
    absent_is_zero=("rejected",))

VLLM = Source(
    "vllm", "vllm:",
    levels={"waiting": ("num_requests_waiting",), "running": ("num_requests_running",),
            "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
            "waiting_by_reason": ("num_requests_waiting_by_reason",)},
    counters={"preemptions": ("num_preemptions",), **_TOKENS, **_SUCCESS,
              "rejected": ("admission_rejections",),
              "steps": ("iteration_tokens_total_count",),
              "prefix_cache_hits": ("prefix_cache_hits",)},
    histograms={**_TTFT_E2E, "tpot": ("request_time_per_output_token_seconds",),
                "itl": ("inter_token_latency_seconds", "time_per_output_token_seconds"),
                "iteration_tokens": ("iteration_tokens_total",)},
    cache_info="cache_config_info")

SGLANG = Source(
    "sglang", "sglang:",
    levels={"waiting": ("num_queue_reqs",), "running": ("num_running_reqs",),
            "kv_usage": ("token_usage",)},
    counters={"preemptions": ("num_retracted_requests",), **_TOKENS,
              "requests_finished": ("num_requests",)},
    histograms={**_TTFT_E2E,
                "tpot": ("inter_token_latency_seconds", "time_per_output_token_seconds")})

TGI = Source(
    "tgi", "tgi_",
    levels={"waiting": ("queue_size",), "running": ("batch_current_size",)},
    counters={"prompt_tokens": ("request_input_length_sum",),
              "generation_tokens": ("request_generated_tokens_sum",),
              "requests_finished": ("request_success",),
              "steps": ("batch_inference_success",)},
    histograms={"e2e": ("request_duration",),
                "tpot": ("request_mean_time_per_token_duration",),
                "step_time": ("batch_inference_duration",)})

LLAMACPP = Source(
    "llamacpp", "llamacpp:",
    levels={"waiting": ("requests_deferred",), "running": ("requests_processing",),
            "kv_usage": ("kv_cache_usage_ratio",)},
    counters={"prompt_tokens": ("prompt_tokens",), "generation_tokens": ("tokens_predicted",),
              "steps": ("n_decode",)},
    histograms={})

SOURCES: tuple[Source, ...] = (STEPSERVE, VLLM, SGLANG, TGI, LLAMACPP)
KNOWN_PREFIXES = ", ".join(s.prefix for s in SOURCES)


Samples = dict[tuple[str, frozenset], float]


def parse_prometheus(text: str, non_finite: set[str] | None = None) -> Samples:
    """{(sample name, frozenset of (label, value)): value}. The strict parser refuses a
    whole text for one bad line; then each line is read alone and bad ones skipped, so
    one odd series does not blind a reader to the rest. (prometheus_client's parser
    raises IndexError, not ValueError, on some garbage: both are a bad text.) A NaN or
    infinite value (legal in the format) is read as missing, so no sum, rate or quantile
    sees it; the names of those series go into `non_finite` where it is given."""
    dropped = set() if non_finite is None else non_finite
    try:
        return _samples(text, dropped)
    except (ValueError, IndexError):
        pass
    out: Samples = {}
    for line in sample_lines(text):
        try:
            out.update(_samples(line + "\n", dropped))
        except (ValueError, IndexError):
            continue
    return out


def sample_lines(text: str) -> list[str]:
    """The sample lines (series) of `text`: lines neither blank nor comments."""
    return [line for line in text.split("\n")
            if line.strip() and not line.lstrip().startswith("#")]


def _samples(text: str, non_finite: set[str]) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            value = float(s.value)
            if math.isfinite(value):
                out[(s.name, frozenset(s.labels.items()))] = value
            else:
                non_finite.add(s.name)
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

    def quantile_in(self, q: float) -> BucketQuantile | None:
        return bucket_quantile_in(q, self.buckets)

    @property
    def mean(self) -> float | None:
        if self.sum is None or not self.count:
            return None
        return self.sum / self.count


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


@dataclass(frozen=True)
class BucketQuantile:
    """A quantile read from buckets: `value` as histogram_quantile interpolates it, and
    the bucket it lies in, (lower, upper]; all the buckets say is that the true quantile
    is somewhere in there. The +Inf bucket's upper is math.inf (its value: `lower`)."""

    value: float
    lower: float
    upper: float


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets as Prometheus' histogram_quantile computes it
    (bucket_quantile_in's value)."""
    found = bucket_quantile_in(q, buckets)
    return None if found is None else found.value


def bucket_quantile_in(q: float, buckets: Sequence[tuple[float, float]]
                       ) -> BucketQuantile | None:
    """The q-quantile of cumulative buckets and the bucket holding it: find the bucket
    holding rank q x total, interpolate linearly inside it (from 0 for the first
    bucket), and answer the highest finite bound when the rank falls in +Inf, as
    Prometheus' histogram_quantile does. None without a +Inf bucket, with under two
    buckets, or with no observations."""
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
        return BucketQuantile(bs[-2][0], bs[-2][0], math.inf)
    upper = bs[b][0]
    if b == 0:
        if upper <= 0:
            return BucketQuantile(upper, upper, upper)
        lower, below = 0.0, 0.0
    else:
        lower, below = bs[b - 1][0], counts[b - 1]
    return BucketQuantile(lower + (upper - lower) * (rank - below) / (counts[b] - below),
                          lower, upper)


@dataclass
class Snapshot:
    """One scrape of `/metrics`: when (a monotonic clock, seconds) and what it held."""

    t_s: float
    samples: Samples
    non_finite: tuple[str, ...] = ()  # series whose values were NaN or infinite: dropped

    def source(self) -> Source | None:
        return self._source

    @cached_property
    def _source(self) -> Source | None:
        return detect_source(self.samples)

    def _names(self, kind: str, key: str) -> list[str]:
        """The series names to try for `key` of `kind` (levels, counters, histograms), in
        order; none without a known source."""
        src = self.source()
        return [] if src is None else [src.prefix + base
                                       for base in getattr(src, kind).get(key, ())]

    def _sum(self, name: str, keep: Callable[[frozenset], bool] | None = None
             ) -> float | None:
        vals = [v for (n, ls), v in self.samples.items()
                if n == name and (keep is None or keep(ls))]
        return sum(vals) if vals else None

    def level(self, key: str) -> float | None:
        """waiting, running or kv_usage (0..1) now, summed over label sets; None where the
        source has no such series."""
        return next((v for name in self._names("levels", key)
                     if (v := self._sum(name)) is not None), None)

    def counter(self, key: str) -> float | None:
        """A counter's value (one of COUNTERS), with or without `_total`."""
        keep = _completed if key == "requests_finished" else None
        return next((v for name in self._names("counters", key)
                     for n in (name, name + "_total") if (v := self._sum(n, keep)) is not None),
                    0.0 if self._absent_is_zero(key) else None)

    def _absent_is_zero(self, key: str) -> bool:
        src = self.source()
        return src is not None and key in src.absent_is_zero

    def by_reason(self, key: str) -> dict[str, float] | None:
        """A BY_REASON series as {reason: value} (summed over its other labels; a counter
        with or without `_total`); None where the source has no such series."""
        kind = BY_REASON[key]
        suffixes = ("", "_total") if kind == "counters" else ("",)
        for name in (n + suffix for n in self._names(kind, key) for suffix in suffixes):
            out: dict[str, float] = {}
            for (n, ls), v in self.samples.items():
                if n == name:
                    reason = dict(ls).get(REASON, "")
                    out[reason] = out.get(reason, 0.0) + v
            if out:
                return out
        return {} if self._absent_is_zero(key) else None

    def histogram(self, key: str) -> Histogram | None:
        """A histogram (one of HISTOGRAMS), buckets summed over label sets."""
        for name in self._names("histograms", key):
            per_le: dict[float, float] = {}
            for (n, ls), v in self.samples.items():
                if n == name + "_bucket" and (bound := _bound(dict(ls).get("le"))) is not None:
                    per_le[bound] = per_le.get(bound, 0.0) + v
            count = self._sum(name + "_count")
            if per_le or count is not None:
                return Histogram(tuple(sorted(per_le.items())), self._sum(name + "_sum"),
                                 count)
        return None

    def info(self, which: str = "config_info") -> dict[str, str] | None:
        """The labels of the source's config info gauge, or (`which` "cache_info") its KV
        cache info gauge (model_name and engine left out)."""
        src = self.source()
        base = None if src is None else getattr(src, which)
        if src is None or base is None:
            return None
        name = src.prefix + base
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


def counter_delta_by_reason(before: Snapshot, after: Snapshot, key: str
                            ) -> dict[str, float] | None:
    """A BY_REASON counter's increase per reason from `before` to `after` (a reason first
    seen in `after` counts from 0; a fall is a restart, as in counter_delta); None where
    either scrape lacks the series."""
    a, b = before.by_reason(key), after.by_reason(key)
    if a is None or b is None:
        return None
    return {reason: v - a.get(reason, 0.0) if v >= a.get(reason, 0.0) else v
            for reason, v in b.items()}


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
