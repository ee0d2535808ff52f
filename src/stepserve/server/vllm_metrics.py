"""/metrics under vLLM's own names (`vllm:`), for what reads a vLLM server's page: its
Grafana dashboards, the Gateway API Inference Extension's endpoint picker
(`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`'s
block_size and num_gpu_blocks), alerting rules. The reference is vLLM 0.32.0's page
(tests/fixtures/vllm-0.32.0/metrics_*.txt): its names, types, labels and buckets.

Most `vllm:` families are made at scrape time from the same page's `stepserve:` ones
(COPIES): the same samples under vLLM's name, keeping only the buckets vLLM has. Ours
are a superset of vLLM's, and a cumulative bucket count stays right when the buckets
between two kept ones are dropped, so a copy is exact; it never disagrees with its
original on one page, and the engine thread does no work for it. The rest are made
from what the engine knows: a few are fed where our own series are (per-request `n`,
`max_tokens`, preemptions and computed prefill tokens; prompt tokens by source), the
others are read off the page or the engine's settings (`families`).

Left out, as nothing here can compute them honestly: `estimated_flops_per_gpu`,
`estimated_read_bytes_per_gpu` and `estimated_write_bytes_per_gpu` (vLLM's analytic
model of each layer's FLOPs and memory traffic, which we do not have), and
`mm_cache_queries`/`mm_cache_hits` (the multi-modal input cache of a model we do not
serve). `lora_requests_info` is not on vLLM's page without LoRA, and we have no LoRA.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepserve.config.settings import CacheConfig
from stepserve.core.end_reasons import (
    AS_VLLM_FINISHED,
    VLLM_ADMISSION_REASONS,
    VLLM_FINISHED_REASONS,
)
from stepserve.core.request import Request
from stepserve.metrics.request_metrics import RequestLatencies

if TYPE_CHECKING:
    from stepserve.engine.llm_engine import LLMEngine

V = "vllm:"
# vLLM's buckets where ours have more (each must be a subset of ours: VllmMetrics checks)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                         1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# and for the series only vLLM had
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
N_BUCKETS = (1, 2, 5, 10, 20)

@dataclass(frozen=True, slots=True)
class Copy:
    """Our series `ours` (its name after `stepserve:`) under vLLM's `name` and HELP;
    `buckets`: vLLM's, where ours have more (None: ours are vLLM's)."""

    ours: str
    name: str
    help: str
    buckets: tuple[float, ...] | None = None


COPIES: tuple[Copy, ...] = (
    Copy("num_requests_running", "num_requests_running", "Requests in the running batch."),
    Copy("kv_cache_usage_perc", "kv_cache_usage_perc",
         "Share of the device KV blocks in use; 1 is every block."),
    Copy("prefix_cache_queries", "prefix_cache_queries",
         "Prompt tokens looked up in the prefix cache."),
    Copy("prefix_cache_hits", "prefix_cache_hits",
         "Prompt tokens the prefix cache had (of those looked up)."),
    Copy("num_preemptions", "num_preemptions", "Preemptions since the engine started."),
    Copy("prompt_tokens", "prompt_tokens", "Prompt tokens of requests that began to answer."),
    Copy("generation_tokens", "generation_tokens", "Tokens generated."),
    Copy("request_prompt_tokens", "request_prompt_tokens",
         "Prompt tokens of each finished request."),
    Copy("request_generation_tokens", "request_generation_tokens",
         "Tokens generated for each finished request."),
    Copy("iteration_tokens_total", "iteration_tokens_total", "Tokens computed per engine step."),
    Copy("time_to_first_token_seconds", "time_to_first_token_seconds",
         "Seconds from arrival to the first token."),
    Copy("inter_token_latency_seconds", "inter_token_latency_seconds",
         "Seconds between two consecutive tokens of a request.", TOKEN_LATENCY_BUCKETS),
    Copy("request_time_per_output_token_seconds", "request_time_per_output_token_seconds",
         "Each request's mean seconds per output token after the first.",
         TOKEN_LATENCY_BUCKETS),
    Copy("e2e_request_latency_seconds", "e2e_request_latency_seconds",
         "Seconds from arrival to the last token.", REQUEST_LATENCY_BUCKETS),
    Copy("request_queue_time_seconds", "request_queue_time_seconds",
         "Seconds a request waited before it was first scheduled.", REQUEST_LATENCY_BUCKETS),
    Copy("request_inference_time_seconds", "request_inference_time_seconds",
         "Seconds from first scheduled to the last token.", REQUEST_LATENCY_BUCKETS),
    Copy("request_prefill_time_seconds", "request_prefill_time_seconds",
         "Seconds from first scheduled to the first token.", REQUEST_LATENCY_BUCKETS),
    Copy("request_decode_time_seconds", "request_decode_time_seconds",
         "Seconds from the first token to the last.", REQUEST_LATENCY_BUCKETS),
)

# cache_config_info's labels for what we do not have: the value vLLM 0.32 shows with the
# feature off (no Mamba layers, no KV offloading or sharing, one attention block size)
FEATURES_OFF = {
    "cache_hit_alignment_tokens": "None", "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
    "kv_offloading_backend": "native", "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto",
    "prefix_cache_retention_interval": "0", "prefix_match_unit": "None",
    "replayssm_buffer_len": "16", "skip_page_size_padded": "None",
    "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
}


def cache_config_labels(engine: LLMEngine) -> dict[str, str]:
    """vLLM's cache_config_info labels for `engine`, by name (fixed once it is built)."""
    cache = engine.config.cache
    snap = engine.core.snapshot()
    block_size = cache.block_size
    max_len = engine.config.scheduler.max_model_len
    ours = {
        "block_size": block_size, "effective_attention_block_size": block_size,
        "_block_size_resolved": True,  # ours is always the configured size
        # the config keeps no record of who chose the size: one off the default was chosen
        "user_specified_block_size": block_size != CacheConfig.block_size,
        "num_gpu_blocks": snap.num_gpu_blocks,
        "num_gpu_blocks_override": cache.num_gpu_blocks,  # None unless configured
        "num_cpu_blocks": snap.num_cpu_blocks,
        "enable_prefix_caching": cache.enable_prefix_caching,
        # what the KV manager names blocks with (prefix_hash.namer refuses any other)
        "prefix_caching_hash_algo": cache.prefix_caching_hash_algo,
        "cache_dtype": "auto",  # the KV cache is kept in the model's dtype
        "gpu_memory_utilization": cache.gpu_memory_utilization,  # None unless configured
        "kv_cache_memory_bytes": cache.kv_cache_memory,  # None unless configured
        "kv_cache_size_tokens": snap.num_gpu_blocks * block_size,
        # requests of max_model_len tokens the device pool holds at once
        "kv_cache_max_concurrency": snap.num_gpu_blocks / -(-max_len // block_size),
        "sliding_window": engine.runner.args.sliding_window,
    }
    return {**FEATURES_OFF, **{k: str(v) for k, v in ours.items()}}


def copy_family(family: Metric, name: str, doc: str, buckets: frozenset[float] | None = None,
                relabel: Mapping[str, Mapping[str, str]] | None = None) -> Metric:
    """`family` under `name`: only the buckets in `buckets` (and +Inf) where given, and
    `relabel`'s label values ({label: {ours: vLLM's}}) with the samples they merge summed."""
    out = Metric(name, doc, family.type)
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for s in family.samples:
        suffix = s.name[len(family.name):]
        le = s.labels.get("le")
        if buckets is not None and le is not None and le != "+Inf" and float(le) not in buckets:
            continue
        labels = s.labels
        if relabel:
            labels = {k: relabel.get(k, {}).get(v, v) for k, v in labels.items()}
        key = (suffix, tuple(labels.items()))
        merged[key] = merged.get(key, 0.0) + s.value
    for (suffix, labels), value in merged.items():
        out.add_sample(name + suffix, dict(labels), value)
    return out


def _sum(family: Metric | None, **labels: str) -> float:
    """The sum of `family`'s samples that carry `labels` (0 where it is absent)."""
    if family is None:
        return 0.0
    want = labels.items()
    return sum(s.value for s in family.samples if want <= s.labels.items())


@dataclass(slots=True)
class _Group:
    """An n > 1 request while its sequences end."""

    ended: int = 0
    most_tokens: int = 0  # the most one sequence generated
    all_completed: bool = True


class VllmMetrics:
    """The `vllm:` families of one app (labels `labels`, values `label_values`).
    `token_counts`: the buckets of our per-request token histograms (vLLM's too);
    `our_buckets`: each of our histograms' buckets, by name after `stepserve:`."""

    def __init__(self, labels: Sequence[str], label_values: Sequence[str],
                 token_counts: tuple[float, ...],
                 our_buckets: Mapping[str, tuple[float, ...]]) -> None:
        self.labels = list(labels)
        self.label_values = list(label_values)
        self.by_label = dict(zip(self.labels, self.label_values, strict=True))
        self._buckets: dict[str, frozenset[float] | None] = {}
        for c in COPIES:
            if c.buckets is not None and not set(c.buckets) <= set(our_buckets[c.ours]):
                raise ValueError(f"vLLM's buckets of {c.name} are not a subset of ours")
            self._buckets[c.ours] = None if c.buckets is None else frozenset(c.buckets)
        self._cache_labels: dict[str, str] | None = None  # once an engine is watched
        self._groups: dict[str, _Group] = {}  # by parent id

        # the series only vLLM had, fed per request; in no registry: `families` emits them
        # (the whole family: a child alone does not know its labels)
        self._histograms: list[Histogram] = []

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            family = Histogram(V + name, doc, self.labels, registry=None, buckets=buckets)
            self._histograms.append(family)
            return family.labels(*self.label_values)

        self.max_num_generation_tokens = histogram(
            "request_max_num_generation_tokens", "Per finished request, the most tokens one "
            "of its n sequences generated.", token_counts)
        self.params_n = histogram("request_params_n", "The n of each finished request.",
                                  N_BUCKETS)
        self.params_max_tokens = histogram(
            "request_params_max_tokens", "The max_tokens of each finished sequence.",
            token_counts)
        self.num_preemptions = histogram(
            "request_num_preemptions", "Times each finished sequence was preempted.",
            PREEMPTION_BUCKETS)
        self.prefill_kv_computed = histogram(
            "request_prefill_kv_computed_tokens", "Prompt tokens each finished sequence "
            "computed (those the prefix cache gave left out).", token_counts)
        # counted as prompt_tokens is, when a request's first token comes out
        self.by_source = Counter(V + "prompt_tokens_by_source", "Prompt tokens by where "
                                 "their KV came from: computed here, this engine's prefix "
                                 "cache, or a KV transfer (none here).",
                                 [*self.labels, "source"], registry=None)
        self.computed, self.cache_hit, _ = (
            self.by_source.labels(*self.label_values, source) for source in
            ("local_compute", "local_cache_hit", "external_kv_transfer"))

    def watch(self, engine: LLMEngine) -> None:
        self._cache_labels = cache_config_labels(engine)

    # ---- fed by the engine thread ----
    def on_first_token(self, req: Request) -> None:
        cached = req.num_cached_tokens
        self.computed.inc(req.num_prompt_tokens - cached)  # >= 1: never the last token
        if cached:
            self.cache_hit.inc(cached)

    def on_finished(self, req: Request, m: RequestLatencies, last: bool) -> None:
        """`last`: the last of its request's n sequences to end. As our per-request
        histograms, these take completed sequences (a request: all n completed)."""
        if m.completed:
            if req.max_tokens is not None:
                self.params_max_tokens.observe(req.max_tokens)
            self.num_preemptions.observe(req.num_preemptions)
            self.prefill_kv_computed.observe(req.num_prompt_tokens - req.num_cached_tokens)
        group = self._groups.pop(req.parent_id, None) if req.parent_id else None
        group = group or _Group()
        group.ended += 1
        group.most_tokens = max(group.most_tokens, m.num_output_tokens)
        group.all_completed &= m.completed
        if not last:
            assert req.parent_id is not None  # only an n > 1 request has sequences left
            self._groups[req.parent_id] = group
        elif group.all_completed:
            self.params_n.observe(group.ended)
            self.max_num_generation_tokens.observe(group.most_tokens)

    # ---- at scrape time ----
    def families(self, ours: Mapping[str, Metric]) -> Iterator[Metric]:
        """The `vllm:` families, from the page's own (`ours`: by name after
        `stepserve:`) and what was fed here."""
        for c in COPIES:
            if c.ours in ours:
                yield copy_family(ours[c.ours], V + c.name, c.help, self._buckets[c.ours])
        # vLLM has no swap queue: a preempted request waits in its waiting queue
        waiting = _sum(ours.get("num_requests_waiting")) + _sum(ours.get("num_requests_swapped"))
        yield self._gauge("num_requests_waiting", "Requests waiting to be scheduled "
                          "(swapped-out ones included).", waiting)
        yield self._gauge("num_requests_waiting_by_reason", "Waiting requests by why: "
                          "capacity (for room in the batch or the KV cache), deferred (held "
                          "back by a transient constraint; we hold none back).",
                          {"capacity": waiting, "deferred": 0}, "reason")
        yield self._gauge("engine_sleep_state", "Whether the engine sleeps (we have no sleep "
                          "mode: always awake).",
                          {"awake": 1, "weights_offloaded": 0, "discard_all": 0}, "sleep_state")
        for name, doc in (("external_prefix_cache_queries", "Prompt tokens looked up in a "
                           "KV connector's cache shared across instances (we have none)."),
                          ("external_prefix_cache_hits", "Of those, the tokens it had.")):
            yield self._counter(name, doc, 0)
        by_source = self.by_source.collect()[0]
        yield by_source
        yield self._counter("prompt_tokens_cached", "Prompt tokens whose KV came from a cache "
                            "(this engine's or an external one).",
                            _sum(by_source, source="local_cache_hit"))
        yield self._counter("prompt_tokens_cached_by_source", "Prompt tokens the prefix cache "
                            "gave, by the tier that held them (counted at admission; only the "
                            "device tier here).",
                            {"device": _sum(ours.get("prefix_cache_hits")), "host": 0,
                             "p2p": 0, "disk": 0, "external_unspecified": 0}, "source")
        success = ours.get("request_success")
        if success is not None:
            yield self._success(success)
        rejected = ours.get("request_rejected")
        family = CounterMetricFamily(V + "admission_rejections", "Requests refused at "
                                     "admission by a queue limit, by which.",
                                     labels=["model_name", "reason"])  # no engine label
        for reason, our_reason in VLLM_ADMISSION_REASONS.items():
            value = _sum(rejected, reason=our_reason) if our_reason else 0
            family.add_metric([self.by_label["model_name"], reason], value)
        yield family
        for hist in self._histograms:
            yield from hist.collect()
        if self._cache_labels is not None:  # vLLM's carries the engine, not the model
            family = GaugeMetricFamily(V + "cache_config_info", "The KV cache's settings, as "
                                       "labels.", labels=["engine", *self._cache_labels])
            family.add_metric([self.by_label["engine"], *self._cache_labels.values()], 1)
            yield family

    def _success(self, ours: Metric) -> Metric:
        """request_success with vLLM's finish reasons (each, 0 where none ended so)."""
        family = copy_family(ours, V + "request_success", "Requests ended, by finish reason.",
                             relabel={"finished_reason": AS_VLLM_FINISHED})
        have = {s.labels.get("finished_reason") for s in family.samples}
        for reason in VLLM_FINISHED_REASONS:
            if reason not in have:
                family.add_sample(V + "request_success_total",
                                  {**self.by_label, "finished_reason": reason}, 0.0)
        order = {r: i for i, r in enumerate(VLLM_FINISHED_REASONS)}
        family.samples.sort(key=lambda s: order.get(s.labels.get("finished_reason", ""), 0))
        return family

    def _gauge(self, name: str, doc: str, value: float | Mapping[str, float],
               label: str | None = None) -> Metric:
        return self._family(GaugeMetricFamily, name, doc, value, label)

    def _counter(self, name: str, doc: str, value: float | Mapping[str, float],
                 label: str | None = None) -> Metric:
        return self._family(CounterMetricFamily, name, doc, value, label)

    def _family(self, kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str,
                doc: str, value: float | Mapping[str, float], label: str | None) -> Metric:
        """One series of `value`; with `label`, one per {label value: value} of `value`."""
        values = {None: value} if label is None else value
        assert isinstance(values, Mapping)
        family = kind(V + name, doc, labels=self.labels + ([label] if label else []))
        for label_value, v in values.items():
            family.add_metric(self.label_values + ([label_value] if label else []), v)
        return family
