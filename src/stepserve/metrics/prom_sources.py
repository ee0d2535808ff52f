"""Which series each kind of server exposes for each signal the bench and the doctor
read (see prometheus.py for how they are read).

Where the names come from:
  stepserve: src/stepserve/server/metrics.py (vLLM's names under `stepserve:`).
  vLLM: vllm/v1/metrics/loggers.py (PrometheusStatLogger) and docs/design/metrics.md in
      vllm-project/vllm: num_requests_waiting/_running, kv_cache_usage_perc (0.9+; before
      that gpu_cache_usage_perc, kept as a deprecated alias), num_preemptions,
      prompt_tokens, generation_tokens, request_success{finished_reason},
      time_to_first_token_seconds, e2e_request_latency_seconds,
      request_time_per_output_token_seconds (newer; older versions only have
      time_per_output_token_seconds, later split into inter_token_latency_seconds),
      iteration_tokens_total (a histogram observed once per engine step: its _count
      counts steps).
  SGLang: python/sglang/srt/metrics/collector.py and docs/references/production_metrics.md
      in sgl-project/sglang: num_queue_reqs, num_running_reqs, token_usage (0..1),
      num_retracted_requests_total (retractions: SGLang's preemption), prompt_tokens_total,
      generation_tokens_total and num_requests_total (all three counted when a request
      finishes), time_to_first_token_seconds, e2e_request_latency_seconds,
      inter_token_latency_seconds (older: time_per_output_token_seconds).
  TGI: docs/source/reference/metrics.md in huggingface/text-generation-inference (router
      metrics, `tgi_` prefix): queue_size, batch_current_size, request_success,
      request_input_length and request_generated_tokens (histograms of tokens per
      request: their _sum counts prompt and generated tokens), request_duration (E2E),
      request_mean_time_per_token_duration (TPOT), batch_inference_duration and
      batch_inference_success (per forward pass, by method prefill/decode). TGI has no
      TTFT histogram, no KV usage and no preemption counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LEVELS = ("waiting", "running", "kv_usage")
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens", "requests_finished", "steps",
            "prefill_only_steps", "zero_decode_steps", "active_sequence_steps",
            "held_slot_steps")
HISTOGRAMS = ("ttft", "e2e", "tpot", "step_time")


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

    def __post_init__(self) -> None:
        for kind, keys, known in (("levels", self.levels, LEVELS),
                                  ("counters", self.counters, COUNTERS),
                                  ("histograms", self.histograms, HISTOGRAMS)):
            unknown = set(keys) - set(known)
            if unknown:
                raise ValueError(f"Source {self.name}: unknown {kind} {sorted(unknown)}")


STEPSERVE = Source(
    "stepserve", "stepserve:",
    levels={"waiting": ("num_requests_waiting",), "running": ("num_requests_running",),
            "kv_usage": ("kv_cache_usage_perc",)},
    counters={"preemptions": ("num_preemptions",), "prompt_tokens": ("prompt_tokens",),
              "generation_tokens": ("generation_tokens",),
              "requests_finished": ("request_success",), "steps": ("steps",),
              "prefill_only_steps": ("prefill_only_steps",),
              "zero_decode_steps": ("zero_decode_steps",),
              "active_sequence_steps": ("active_sequence_steps",),
              "held_slot_steps": ("held_slot_steps",)},
    histograms={"ttft": ("time_to_first_token_seconds",),
                "e2e": ("e2e_request_latency_seconds",),
                "tpot": ("request_time_per_output_token_seconds",),
                "step_time": ("step_duration_seconds",)},
    config_info="scheduler_config_info")

VLLM = Source(
    "vllm", "vllm:",
    levels={"waiting": ("num_requests_waiting",), "running": ("num_requests_running",),
            "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc")},
    counters={"preemptions": ("num_preemptions",), "prompt_tokens": ("prompt_tokens",),
              "generation_tokens": ("generation_tokens",),
              "requests_finished": ("request_success",),
              "steps": ("iteration_tokens_total_count",)},
    histograms={"ttft": ("time_to_first_token_seconds",),
                "e2e": ("e2e_request_latency_seconds",),
                "tpot": ("request_time_per_output_token_seconds",
                         "time_per_output_token_seconds", "inter_token_latency_seconds")})

SGLANG = Source(
    "sglang", "sglang:",
    levels={"waiting": ("num_queue_reqs",), "running": ("num_running_reqs",),
            "kv_usage": ("token_usage",)},
    counters={"preemptions": ("num_retracted_requests",), "prompt_tokens": ("prompt_tokens",),
              "generation_tokens": ("generation_tokens",),
              "requests_finished": ("num_requests",)},
    histograms={"ttft": ("time_to_first_token_seconds",),
                "e2e": ("e2e_request_latency_seconds",),
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

SOURCES: tuple[Source, ...] = (STEPSERVE, VLLM, SGLANG, TGI)
KNOWN_PREFIXES = ", ".join(s.prefix for s in SOURCES)
