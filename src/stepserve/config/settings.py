"""Engine settings: one frozen dataclass per subsystem. Each field's `metadata` holds its
help, kind and allowed range, so the CLI flags, the YAML loader and validation all come
from one place; a bad value raises `ConfigError` naming the key, the value and what is
allowed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.limits import (
    MAX_BATCHED_TOKENS,
    MAX_BLOCKS,
    MAX_KV_BYTES,
    MAX_LEN,
    MAX_NUM_REQUESTS,
    MAX_NUM_SEQS,
    MAX_REPLICAS,
    MAX_SECONDS,
    MAX_THREADS,
)
from stepserve.config.validate import Allowed


class ConfigError(UsageError):
    """A configuration value is missing, unknown, of the wrong type, or out of range."""


def knob(default: Any, help: str, kind: type, *, lo: float | None = None,
         hi: float | None = None, choices: tuple[str, ...] = (), optional: bool = False) -> Any:
    allowed = Allowed(lo, hi, kind, choices=choices, optional=optional)
    return field(default=default, metadata={"help": help, "kind": kind, "allowed": allowed})


class _Section:
    """A config section (or the whole config): each setting checked (a float setting
    normalised to float), then the cross-field rules (`_check_relations`)."""

    SECTION = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if "allowed" in f.metadata:  # a setting, not a section
                key = f"{self.SECTION}.{f.name}" if self.SECTION else f.name
                value = f.metadata["allowed"].check(key, getattr(self, f.name), ConfigError)
                object.__setattr__(self, f.name, value)
        self._check_relations()

    def _check_relations(self) -> None:
        pass


BATCHING_MODES = ("continuous", "static", "dynamic")
PREFIX_CACHING_HASH_ALGOS = ("builtin", "sha256", "xxhash")  # core/prefix_hash.py
POLICIES = ("fcfs", "priority", "srpt", "fair", "lpm")
PREEMPTION_MODES = ("recompute", "swap", "none")
BUDGET_ORDERS = ("decode_first", "prefill_first")
ROUTERS = ("round_robin", "least_outstanding", "prefix_affinity")


@dataclass(frozen=True)
class SchedulerConfig(_Section):
    """How each step's batch is formed."""

    SECTION = "scheduler"

    batching: str = knob("continuous", "continuous: re-form the batch every step; static: a batch "
                         "runs until its last member ends; dynamic: a batch closes at max_num_seqs "
                         "requests or after batch_window_s, then runs to completion",
                         str, choices=BATCHING_MODES)
    max_num_seqs: int = knob(256, "most sequences running at once (batch slots)", int, lo=1,
                             hi=MAX_NUM_SEQS)
    max_num_batched_tokens: int = knob(8192, "token budget of one step (prefill + decode)",
                                       int, lo=1, hi=MAX_BATCHED_TOKENS)
    enable_chunked_prefill: bool = knob(True, "split long prompts across steps", bool)
    long_prefill_token_threshold: int = knob(
        0, "prompts longer than this are 'long' and get at most this many tokens per step "
        "(0: no per-request cap)", int, lo=0, hi=MAX_BATCHED_TOKENS)
    max_num_partial_prefills: int = knob(1, "most prompts mid-prefill at once (chunked prefill)",
                                         int, lo=1, hi=MAX_NUM_SEQS)
    max_long_partial_prefills: int = knob(
        1, "most long prompts (over long_prefill_token_threshold) mid-prefill at once", int, lo=1,
        hi=MAX_NUM_SEQS)
    max_model_len: int = knob(4096, "longest prompt + max_tokens a request may ask for", int, lo=1,
                              hi=MAX_LEN)
    budget_order: str = knob("decode_first", "who gets the step budget first: decode_first "
                             "(running sequences, then new prompts) or prefill_first (legacy: "
                             "prompts first, decode gets what is left)", str,
                             choices=BUDGET_ORDERS)
    policy: str = knob("fcfs", "queue order and victim choice", str, choices=POLICIES)
    preemption_mode: str = knob("recompute", "when KV blocks run out: recompute (drop KV, "
                                "re-prefill later), swap (copy KV to the CPU pool), none (reserve "
                                "prompt + max_tokens at admission, never evict)", str,
                                choices=PREEMPTION_MODES)
    batch_window_s: float = knob(0.05, "dynamic batching: close a batch this long after its "
                                 "first request arrived", float, lo=0.0, hi=MAX_SECONDS)

    def _check_relations(self) -> None:
        t = self.long_prefill_token_threshold
        if t > self.max_num_batched_tokens:
            raise ConfigError(
                f"scheduler.long_prefill_token_threshold = {t}: a chunk cannot exceed the step "
                f"budget max_num_batched_tokens = {self.max_num_batched_tokens}; allowed: "
                f"0..{self.max_num_batched_tokens}")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ConfigError(
                f"scheduler.max_long_partial_prefills = {self.max_long_partial_prefills}: must "
                f"be <= max_num_partial_prefills = {self.max_num_partial_prefills}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"scheduler.max_num_batched_tokens = {self.max_num_batched_tokens}: without "
                f"chunked prefill it must be >= max_model_len = {self.max_model_len}, or a long "
                f"prompt could never be scheduled; raise it or enable_chunked_prefill")

    @property
    def chunk_cap(self) -> int:
        """Most prefill tokens one request may take in a step."""
        t = self.long_prefill_token_threshold
        return t if t > 0 else self.max_num_batched_tokens


@dataclass(frozen=True)
class QueueConfig(_Section):
    """Admission control and anti-starvation."""

    SECTION = "queue"

    max_waiting: int = knob(0, "most requests waiting; more are rejected (HTTP 429). 0: no cap",
                            int, lo=0, hi=MAX_NUM_REQUESTS)
    max_queue_time_s: float = knob(0.0, "a request waiting longer than this before it first runs "
                                   "ends as timed_out. 0: wait forever", float, lo=0.0,
                                   hi=MAX_SECONDS)
    # on by default: a reordering policy (lpm above all, whose hot prefixes can keep
    # arriving) must not starve anyone; 10 s is past any interactive TTFT target, so the
    # guard changes nothing while the queue is healthy (docs/guide.md, "The starvation guard")
    aging_after_s: float = knob(10.0, "the starvation guard of every policy that reorders: "
                                "priority raises a waiting request one level every this many "
                                "seconds; srpt, fair and lpm put a request waiting this long "
                                "ahead of younger ones, oldest first; fcfs never reorders. 0: "
                                "off (vLLM's strict order)", float, lo=0.0,
                                hi=MAX_SECONDS)


@dataclass(frozen=True)
class CacheConfig(_Section):
    """The paged KV cache."""

    SECTION = "cache"

    block_size: int = knob(16, "tokens per KV block", int, lo=1, hi=1024)
    num_gpu_blocks: int = knob(None, "device KV blocks; null: derive from kv_cache_memory",
                               int, lo=1, hi=MAX_BLOCKS, optional=True)
    num_cpu_blocks: int = knob(0, "CPU swap pool blocks (swap preemption)", int, lo=0,
                               hi=MAX_BLOCKS)
    watermark: float = knob(0.01, "share of device blocks kept free when admitting new "
                            "requests, so running ones can grow", float, lo=0.0, hi=0.5)
    kv_cache_memory: int = knob(None, "bytes of KV cache (vLLM's kv_cache_memory_bytes; "
                                "4GiB, 4G, 512MiB also read); null: from "
                                "gpu_memory_utilization or a share of free memory (real "
                                "engine), the hardware preset (simulator)", int, lo=1,
                                hi=MAX_KV_BYTES, optional=True)
    gpu_memory_utilization: float = knob(
        None, "share of memory the engine may fill; the KV cache gets the rest, as in "
        "vLLM. On CPU, as vLLM's CPU build: a share of the machine's RAM, less what this "
        "process holds (weights, torch), which must fit in the RAM available; on CUDA: of "
        "the device, less everything in use on it. null: 80% of free device memory, on CPU "
        "25% of MemAvailable up to 4 GiB (or VLLM_CPU_KVCACHE_SPACE GiB where set). "
        "kv_cache_memory and num_gpu_blocks win over it", float, lo=0.01, hi=1.0,
        optional=True)
    enable_prefix_caching: bool = knob(
        True, "automatic prefix caching, as vLLM: full KV blocks are kept (shared by reference "
        "count, evicted least recently used first) and a prompt starting with a cached "
        "prefix computes only the rest; same outputs either way", bool)
    prefix_caching_hash_algo: str = knob(
        "builtin", "what names a full KV block for the prefix cache (vLLM's flag): builtin "
        "(Python's hash, fastest), xxhash, or sha256 (collision resistant across requests "
        "without a cache_salt); the same blocks are shared whichever names them, and the "
        "fast ones never share a block across cache_salt values", str,
        choices=PREFIX_CACHING_HASH_ALGOS)
    swap_space: float = knob(0.0, "GiB of CPU memory for KV swapped out by preemption "
                             "(vLLM's swap_space): sets num_cpu_blocks from the model's KV "
                             "bytes per token. 0: num_cpu_blocks as given", float, lo=0.0,
                             hi=MAX_KV_BYTES / 2**30)

    def _check_relations(self) -> None:
        if self.swap_space and self.num_cpu_blocks:
            raise ConfigError(
                f"cache.swap_space = {self.swap_space:g} and cache.num_cpu_blocks = "
                f"{self.num_cpu_blocks}: both size the CPU swap pool; give one")


@dataclass(frozen=True)
class EngineConfig(_Section):
    """Everything one deployment needs: scheduler, queue, cache, replicas, threads."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    replicas: int = knob(1, "engine replicas behind the router", int, lo=1, hi=MAX_REPLICAS)
    router: str = knob("round_robin", "how requests are spread over replicas", str,
                       choices=ROUTERS)
    threads: int = knob(None, "CPU threads a step runs on (like llama.cpp's --threads); null: "
                        "torch's count (OMP_NUM_THREADS where set), lowered while other "
                        "processes at normal priority keep cores busy", int, lo=1,
                        hi=MAX_THREADS, optional=True)

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with flat changes, e.g. replace(max_num_seqs=40, max_waiting=24)."""
        from stepserve.config.load import apply_nested

        return apply_nested(self, changes)


SECTIONS: dict[str, type[_Section]] = {
    cls.SECTION: cls for cls in (SchedulerConfig, QueueConfig, CacheConfig)}
