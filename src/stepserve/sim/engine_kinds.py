"""Engine kinds: the scheduler settings that make our one scheduler behave as another
engine's does (`--engine-kind vllm|llamacpp|stepserve`). A kind is settings and rules
on `SchedulerConfig`/`CacheConfig`/`QueueConfig`, never a second scheduler: the
simulator runs the same scheduler code as our engine, with these values.

vLLM v1's values are read from its source at 0.32.0 (the CPU build we run beside
ours); each setting names the file and line. llama.cpp's server is mapped as far as
our scheduler can express it; `approximations` names what it cannot (docs/guide.md,
"Engine kinds").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_NUM_SEQS
from stepserve.config.settings import EngineConfig

ENGINE_KINDS = ("stepserve", "vllm", "llamacpp")


@dataclass(frozen=True)
class EngineKind:
    """A kind's settings (our names, flat as `EngineConfig.replace` takes them), where
    each was read, and what of the engine our scheduler can only approximate."""

    name: str
    settings: dict[str, Any]
    sources: dict[str, str]
    approximations: tuple[str, ...] = ()

    def base_config(self) -> EngineConfig:
        """Our defaults with this kind's settings."""
        return EngineConfig().replace(**self.settings) if self.settings else EngineConfig()


_VLLM = "vllm 0.32.0"
VLLM = EngineKind(
    "vllm",
    {
        # the OpenAI server's defaults on a CPU platform (not the GPU table above them)
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        # v1 has no cap on prompts mid-prefill: every running request's next chunk is
        # scheduled while the budget lasts (the running loop), so no cap binds
        "max_num_partial_prefills": MAX_NUM_SEQS,
        "max_long_partial_prefills": MAX_NUM_SEQS,
        "budget_order": "decode_first",
        "policy": "fcfs",
        "preemption_mode": "recompute",
        "aging_after_s": 0.0,  # strict FCFS/priority order, no aging
        "block_size": 128,
        "enable_prefix_caching": True,
        "watermark": 0.0,
        "max_waiting": 0,
    },
    {
        "max_num_seqs": f"{_VLLM} engine/arg_utils.py:2980-2983 (CPU, OPENAI_API_SERVER: "
                        "128 x world_size)",
        "max_num_batched_tokens": f"{_VLLM} engine/arg_utils.py:2975-2979 (CPU, "
                                  "OPENAI_API_SERVER: 2048 x world_size)",
        "enable_chunked_prefill": f"{_VLLM} config/scheduler.py:134",
        "long_prefill_token_threshold": f"{_VLLM} config/scheduler.py:79",
        "max_num_partial_prefills": f"{_VLLM} v1/core/sched/scheduler.py:657 (running "
                                    "requests' chunks, no partial-prefill cap)",
        "max_long_partial_prefills": f"{_VLLM} v1/core/sched/scheduler.py:657",
        "budget_order": f"{_VLLM} v1/core/sched/scheduler.py:657, 899-900 (RUNNING first, "
                        "then WAITING, none admitted in a step that preempted)",
        "policy": f"{_VLLM} config/scheduler.py:159",
        "preemption_mode": f"{_VLLM} v1/core/sched/scheduler.py:1589-1593 (blocks freed, "
                           "num_computed_tokens = 0: recompute)",
        "aging_after_s": f"{_VLLM} v1/core/sched/scheduler.py:797-802 (victim: "
                         "running[-1], or max (priority, arrival); no aging)",
        "block_size": f"{_VLLM} platforms/cpu.py:292-293",
        "enable_prefix_caching": f"{_VLLM} config/cache.py:141",
        "watermark": f"{_VLLM} config/scheduler.py:196",
        "max_waiting": f"{_VLLM} config/scheduler.py:92 (max_num_queued_reqs: None)",
    },
)

LLAMACPP = EngineKind(
    "llamacpp",
    {
        "max_num_seqs": 4,  # -np (n_parallel): the server's slots
        "max_num_batched_tokens": 2048,  # -b (n_batch): tokens per llama_decode call
        "enable_chunked_prefill": True,  # a prompt goes in n_batch pieces
        "long_prefill_token_threshold": 0,
        "max_num_partial_prefills": MAX_NUM_SEQS,  # every slot may be mid-prompt
        "max_long_partial_prefills": MAX_NUM_SEQS,
        "budget_order": "decode_first",  # each slot's sampled token goes in first
        "policy": "fcfs",  # a free slot takes the oldest waiting task
        "preemption_mode": "none",  # a slot owns its context: nothing is evicted
        "aging_after_s": 0.0,
        "enable_prefix_caching": True,  # cache_prompt: on by default
        "watermark": 0.0,
        "max_waiting": 0,
    },
    {
        "max_num_seqs": "llama.cpp tools/server: -np/--parallel (n_parallel)",
        "max_num_batched_tokens": "llama.cpp common/common.h: n_batch = 2048 (-b)",
        "enable_chunked_prefill": "llama.cpp tools/server: prompts split by n_batch",
        "preemption_mode": "llama.cpp tools/server: per-slot context (n_ctx / n_parallel)",
        "enable_prefix_caching": "llama.cpp tools/server: cache_prompt (default true)",
    },
    (
        "n_ubatch (512): a step of n_batch tokens runs as n_batch / n_ubatch physical "
        "passes; the cost model prices the step as one",
        "the prompt cache is per slot (a slot reuses its own last prompt's prefix); ours "
        "is shared by every request, so hits are over-counted where prompts share a "
        "prefix across slots",
        "the KV cache is cells per token, split evenly over the slots; ours is paged "
        "blocks of block_size tokens shared by all, so a long request may hold more than "
        "n_ctx / n_parallel",
    ),
)

STEPSERVE = EngineKind("stepserve", {}, {})

KINDS = {k.name: k for k in (STEPSERVE, VLLM, LLAMACPP)}
# a target profile's engine (its /metrics prefix, profile/target.py) -> our kind
# (sglang and tgi have no kind yet: they run as stepserve, and the run says so)
PROFILE_ENGINES = {"vllm": "vllm", "stepserve": "stepserve", "llamacpp": "llamacpp"}


def get_engine_kind(name: str) -> EngineKind:
    try:
        return KINDS[name]
    except KeyError:
        raise UsageError(f"--engine-kind {name!r}: allowed: {', '.join(ENGINE_KINDS)}"
                         ) from None
