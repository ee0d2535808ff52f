"""Prometheus metrics in vLLM's names and labels (`model_name`, `engine`) under a
`stepserve:` prefix, plus the scheduling signals `stepserve doctor` reads.

As in vLLM, TTFT and inter-token latency are observed as each token comes out (an
aborted request contributes its own); the per-request histograms take completed requests
only, as the offline summary does. What a windowed reader needs (metrics/live_window.py)
is kept as counters and histograms whose increase between scrapes describes the window.
The prefix cache's counters and cache_config_info are read from the engine core's
snapshot at scrape time, so the engine thread does no work for them. Each app has its
own registry (several servers can live in one process), with the default one's process_*,
python_info and python_gc_* too, as vLLM's /metrics has. Unless turned off, the page
also carries vLLM's own names (`vllm:`), made from these at scrape time
(vllm_metrics.py).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stepserve.config.settings import SchedulerConfig
from stepserve.core.end_reasons import (
    REJECTED,
    REJECTED_LABELS,
    SUCCESS,
    SUCCESS_LABELS,
    FinishReason,
    end_of,
    end_reason,
)
from stepserve.core.output import StepRecord
from stepserve.core.request import Request
from stepserve.host.cpu_metrics import CpuMetrics
from stepserve.metrics.request_metrics import request_metrics
from stepserve.server.vllm_metrics import VllmMetrics

if TYPE_CHECKING:
    from stepserve.core.engine_core import EngineCore
    from stepserve.engine.llm_engine import LLMEngine

P = "stepserve:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
# the scheduler settings the doctor's advice names
CONFIG_INFO_FIELDS = ("batching", "max_num_seqs", "max_num_batched_tokens",
                      "long_prefill_token_threshold", "max_num_partial_prefills",
                      "budget_order")
CACHE_INFO_FIELDS = ("block_size", "num_gpu_blocks", "num_cpu_blocks",
                     "enable_prefix_caching")
LABELS = ["model_name", "engine"]  # vLLM's, on every series


def buckets_1_2_5(top: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `top` (vLLM's token-count buckets)."""
    return tuple(float(m * 10 ** e) for e in range(len(str(top))) for m in (1, 2, 5)
                 if m * 10 ** e <= top)


# The series of one app: (attribute, kind, name after P, HELP, and a histogram's buckets
# or a labelled counter's extra label), registered in this order, which is the order
# /metrics lists them in. TOKEN_COUNTS: buckets_1_2_5 up to the app's max_model_len.
TOKEN_COUNTS = "token counts"
SERIES: tuple[tuple, ...] = (
    # levels: set from the engine thread's snapshot (on_state)
    ("running", Gauge, "num_requests_running", "requests in the running batch"),
    ("waiting", Gauge, "num_requests_waiting", "requests waiting to be scheduled"),
    ("swapped", Gauge, "num_requests_swapped", "requests swapped out to the CPU pool"),
    ("kv_usage", Gauge, "kv_cache_usage_perc", "share of KV blocks in use (0..1)"),
    ("blocks_used", Gauge, "num_gpu_blocks_used", "KV blocks in use"),
    ("blocks_total", Gauge, "num_gpu_blocks", "KV blocks in the device pool"),
    ("preemptions", Counter, "num_preemptions", "preemptions (swap or recompute)"),
    ("prompt_tokens", Counter, "prompt_tokens",
     "prompt tokens of requests that produced their first token"),
    ("generation_tokens", Counter, "generation_tokens", "generated tokens"),
    ("success", Counter, SUCCESS, "requests ended, by finish reason", "finished_reason"),
    ("rejected", Counter, REJECTED,
     f"requests refused, by reason ({', '.join(REJECTED_LABELS)})", "reason"),
    # TTFT and ITL observed per token (on_token); the rest per completed request
    ("ttft", Histogram, "time_to_first_token_seconds",
     "time to first token, observed when it comes out (aborted requests too)", TTFT_BUCKETS),
    ("itl", Histogram, "inter_token_latency_seconds",
     "gap between consecutive tokens, observed as each comes out (aborted requests too)",
     TOKEN_BUCKETS),
    ("tpot", Histogram, "request_time_per_output_token_seconds",
     "(E2E - TTFT) / (output tokens - 1)", TOKEN_BUCKETS),
    ("e2e", Histogram, "e2e_request_latency_seconds", "arrival to last token",
     REQUEST_BUCKETS),
    ("queue", Histogram, "request_queue_time_seconds", "arrival to first scheduled",
     REQUEST_BUCKETS),
    ("prefill", Histogram, "request_prefill_time_seconds", "first scheduled to first token",
     REQUEST_BUCKETS),
    ("decode", Histogram, "request_decode_time_seconds", "first token to last token",
     REQUEST_BUCKETS),
    ("inference", Histogram, "request_inference_time_seconds",
     "first scheduled to last token (prefill + decode)", REQUEST_BUCKETS),
    ("request_prompt_tokens", Histogram, "request_prompt_tokens",
     "prompt tokens of each completed request", TOKEN_COUNTS),
    ("request_generation_tokens", Histogram, "request_generation_tokens",
     "generated tokens of each completed request", TOKEN_COUNTS),
    ("iteration_tokens", Histogram, "iteration_tokens_total", "tokens computed per step",
     ITERATION_BUCKETS),
    # the scheduling signals the doctor reads, fed per step (on_steps)
    ("steps", Counter, "steps", "engine steps executed"),
    ("prefill_only_steps", Counter, "prefill_only_steps",
     "steps with prefill tokens and no decode token"),
    ("zero_decode_steps", Counter, "zero_decode_steps",
     "steps where sequences were ready to decode but got no decode token"),
    ("prefill_share", Gauge, "prefill_step_share",
     "prefill-only steps / steps (seed alert: > 0.7)"),
    ("zero_decode_share", Gauge, "zero_decode_step_share",
     "zero-decode steps / steps (seed alert: > 0.1)"),
    ("active", Gauge, "num_sequences_active", "sequences that produced a token in the last step"),
    ("slots_held", Gauge, "num_slots_held", "batch slots held in the last step"),
    ("active_ratio", Gauge, "active_concurrency_ratio",
     "sum of active sequences / sum of slots held over all steps (seed alert: < 0.3)"),
    ("step_duration", Histogram, "step_duration_seconds",
     "engine step wall time (schedule, execute, update)", STEP_BUCKETS),
    ("active_sequence_steps", Counter, "active_sequence_steps",
     "sum over steps of the sequences that produced a token"),
    ("held_slot_steps", Counter, "held_slot_steps", "sum over steps of the batch slots held"),
)
# gauge attribute -> the EngineState field it shows
LEVELS = {"running": "num_running", "waiting": "num_waiting", "swapped": "num_swapped",
          "kv_usage": "kv_usage", "blocks_used": "num_gpu_blocks_used",
          "blocks_total": "num_gpu_blocks"}


class CacheMetrics:
    """The prefix cache's series of one app; absent (the counters at 0) until `watch`."""

    def __init__(self, registry: CollectorRegistry, label_values: tuple[str, ...]) -> None:
        self.label_values = list(label_values)
        self._core: EngineCore | None = None
        registry.register(self)

    def watch(self, core: EngineCore) -> None:
        self._core = core

    def collect(self) -> Iterator[Metric]:
        snap = self._core.snapshot() if self._core is not None else None
        for name, doc, value in (
                ("prefix_cache_queries", "prompt tokens of requests first scheduled that "
                 "looked the prefix cache up", snap.prefix_cache_queries if snap else 0),
                ("prefix_cache_hits", "of those, the tokens the prefix cache gave",
                 snap.prefix_cache_hits if snap else 0)):
            family = CounterMetricFamily(P + name, doc, labels=LABELS)
            family.add_metric(self.label_values, value)
            yield family
        if self._core is not None and snap is not None:
            cache = self._core.config.cache
            values = (cache.block_size, snap.num_gpu_blocks, snap.num_cpu_blocks,
                      cache.enable_prefix_caching)  # True/False as vLLM's
            family = GaugeMetricFamily(P + "cache_config_info", "KV cache settings (as "
                                       "labels)", labels=[*LABELS, *CACHE_INFO_FIELDS])
            family.add_metric([*self.label_values, *map(str, values)], 1)
            yield family

    def describe(self) -> list[Metric]:
        """The names, for the registry's clash check (the info series' too)."""
        return [CounterMetricFamily(P + "prefix_cache_queries", ""),
                CounterMetricFamily(P + "prefix_cache_hits", ""),
                GaugeMetricFamily(P + "cache_config_info", "")]


class _Page(Collector):
    """One scrape's families, as generate_latest takes them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class ServerMetrics:
    def __init__(self, model_name: str, scheduler: SchedulerConfig | None = None,
                 engine: str = "0", vllm_names: bool = True) -> None:
        """`engine`: the value of the `engine` label (vLLM's engine index);
        `vllm_names`: the page carries vLLM's names too (`vllm:`, vllm_metrics.py)."""
        disable_created_metrics()  # no *_created series (process-wide; vLLM does the same)
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.label_values = (model_name, engine)
        token_counts = buckets_1_2_5(scheduler.max_model_len if scheduler else 4096)
        histogram_buckets: dict[str, tuple[float, ...]] = {}
        for attr, kind, name, doc, *extra in SERIES:
            if kind is Histogram:
                buckets = token_counts if extra[0] == TOKEN_COUNTS else extra[0]
                histogram_buckets[name] = buckets
                series = Histogram(P + name, doc, LABELS, registry=self.registry,
                                   buckets=buckets).labels(*self.label_values)
            elif extra:  # a counter with one more label: children made as they are counted
                series = Counter(P + name, doc, [*LABELS, *extra], registry=self.registry)
            else:
                series = kind(P + name, doc, LABELS, registry=self.registry).labels(
                    *self.label_values)
            setattr(self, attr, series)
        # the prefix cache's counters and cache_config_info: AsyncEngine attaches the engine
        self.cache = CacheMetrics(self.registry, self.label_values)
        # whether the CPU is shared: read at scrape time, the step reference fed per step
        self.cpu = CpuMetrics(self.registry, LABELS, self.label_values)
        if scheduler is not None:
            Gauge(P + "scheduler_config_info", "scheduler settings (as labels)",
                  [*LABELS, *CONFIG_INFO_FIELDS], registry=self.registry).labels(
                *self.label_values,
                *(str(getattr(scheduler, f)) for f in CONFIG_INFO_FIELDS)).set(1)
        for reason in SUCCESS_LABELS:
            self.success.labels(*self.label_values, reason)
        self.vllm = VllmMetrics(LABELS, self.label_values, token_counts,
                                histogram_buckets) if vllm_names else None
        # the step counters' totals so far, for the shares and the active ratio
        self._totals: collections.Counter[str] = collections.Counter()
        self._preemptions_seen = 0

    def watch(self, engine: LLMEngine) -> None:
        """Read `engine`'s prefix cache, CPU threads and settings at scrape time."""
        self.cache.watch(engine.core)
        if (threads := getattr(engine, "step_threads", None)) is not None:
            self.cpu.watch(threads)
        if self.vllm is not None:
            self.vllm.watch(engine)

    # ---- fed by the engine thread ----
    def on_state(self, state) -> None:
        for gauge, field in LEVELS.items():
            getattr(self, gauge).set(getattr(state, field))
        if state.num_preemptions_total > self._preemptions_seen:
            self.preemptions.inc(state.num_preemptions_total - self._preemptions_seen)
            self._preemptions_seen = state.num_preemptions_total

    def on_steps(self, records: Sequence[StepRecord], wall_s: float | None = None) -> None:
        """`wall_s`: the wall time of the engine call that ran these steps (shared evenly);
        without it, each record's own duration."""
        for s in records:
            self.step_duration.observe(s.duration_s if wall_s is None
                                       else wall_s / len(records))
            self.iteration_tokens.observe(s.num_prefill_tokens + s.num_decode_tokens)
            self.generation_tokens.inc(s.num_active)
            for counter, amount in (("steps", 1), ("active_sequence_steps", s.num_active),
                                    ("held_slot_steps", s.slots_held),
                                    ("prefill_only_steps", s.is_prefill_only),
                                    ("zero_decode_steps", s.is_zero_decode)):
                if amount:
                    getattr(self, counter).inc(amount)
                    self._totals[counter] += amount
            self.active.set(s.num_active)
            self.slots_held.set(s.slots_held)
        self.cpu.on_steps(records)
        t = self._totals
        if t["steps"]:
            self.prefill_share.set(t["prefill_only_steps"] / t["steps"])
            self.zero_decode_share.set(t["zero_decode_steps"] / t["steps"])
        if t["held_slot_steps"]:
            self.active_ratio.set(t["active_sequence_steps"] / t["held_slot_steps"])

    def on_token(self, req: Request) -> None:
        """`req` has just produced a token: its first is its TTFT (and counts its prompt),
        each later one a gap since the one before. Observed now, however it ends."""
        times = req.token_times
        if len(times) == 1:
            self.ttft.observe(times[0] - req.arrival_time)
            self.prompt_tokens.inc(req.num_prompt_tokens)
            if self.vllm is not None:
                self.vllm.on_first_token(req)
        elif times:
            self.itl.observe(times[-1] - times[-2])

    def on_finished(self, req: Request, ended_as: FinishReason | None = None,
                    last: bool = True) -> None:
        """`ended_as`: how the client's answer ended where it differs from the engine's
        reason (the answer itself failed: FinishReason.ERROR); `last`: the last of its
        request's n sequences to end."""
        end = end_of(ended_as or req.finish_reason, req.reject_reason)
        if end.counter == SUCCESS:  # a refusal is counted where it is answered
            self.success.labels(*self.label_values, end.label).inc()
        m = request_metrics(req)
        if self.vllm is not None:
            self.vllm.on_finished(req, m, last)
        if not m.completed:
            return
        for hist, value in ((self.tpot, m.tpot_s), (self.e2e, m.e2e_s),
                            (self.queue, m.queue_time_s)):
            if value is not None:
                hist.observe(value)
        self.request_prompt_tokens.observe(m.num_prompt_tokens)
        self.request_generation_tokens.observe(m.num_output_tokens)
        times = req.token_times
        if times and req.first_scheduled_time is not None:
            self.prefill.observe(times[0] - req.first_scheduled_time)
            self.decode.observe(times[-1] - times[0])
            self.inference.observe(times[-1] - req.first_scheduled_time)

    # ---- fed by the event loop ----
    def on_rejected(self, reason: str) -> None:
        """`reason`: a RejectReason or Refusal value (end_reasons.py)."""
        end = end_reason(reason)
        if end.counter == REJECTED:
            self.rejected.labels(*self.label_values, end.label).inc()

    def render(self) -> bytes:
        """The page: our families, then vLLM's names made from the same ones (so a
        `vllm:` copy and its `stepserve:` original agree on every page)."""
        families = list(self.registry.collect())
        if self.vllm is not None:
            ours = {f.name[len(P):]: f for f in families if f.name.startswith(P)}
            families += self.vllm.families(ours)
        return generate_latest(_Page(families))
