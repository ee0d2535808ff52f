"""The prefix cache on /metrics, in vLLM's names under `stepserve:`:

* `prefix_cache_queries_total`, `prefix_cache_hits_total` (vLLM's
  `vllm:prefix_cache_queries` / `_hits`): counters in tokens, moved when a request is
  first scheduled: its prompt tokens, and the ones the cache gave it (what its usage
  reports as cached_tokens; n > 1: each sequence counts, as each is scheduled). Their
  increases' ratio over a window is the window's hit rate. A request that does not look
  the cache up (caching off, prompt logprobs asked for) counts in neither.
* `cache_config_info` (vLLM's `vllm:cache_config_info`): value 1, the KV settings as
  labels (block_size, num_gpu_blocks, num_cpu_blocks, enable_prefix_caching), which the
  Gateway API Inference Extension's endpoint picker reads to size each server's cache.

The counts live in the scheduler's KV manager (core/kv_cache.py), which the engine thread
alone writes; a scrape reads them as they stand, through the engine core's snapshot (a
few ints), so the engine thread does no metrics work for them. Until an engine is attached (`watch`) the counters read 0 and the
info series is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from stepserve.core.engine_core import EngineCore

P = "stepserve:"
CACHE_INFO_FIELDS = ("block_size", "num_gpu_blocks", "num_cpu_blocks",
                     "enable_prefix_caching")


class CacheMetrics:
    """One app's prefix cache series (labels `labels`, values `label_values`)."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 label_values: tuple[str, ...]) -> None:
        self.labels = labels
        self.label_values = list(label_values)
        self._core: EngineCore | None = None
        registry.register(self)

    def watch(self, core: EngineCore) -> None:
        """Report this engine core's prefix cache from now on."""
        self._core = core

    def info_labels(self) -> dict[str, str] | None:
        """cache_config_info's labels (None: no engine yet); True/False as vLLM's."""
        core = self._core
        if core is None:
            return None
        snap, cache = core.snapshot(), core.config.cache
        values = (cache.block_size, snap.num_gpu_blocks, snap.num_cpu_blocks,
                  cache.enable_prefix_caching)
        return {f: str(v) for f, v in zip(CACHE_INFO_FIELDS, values, strict=True)}

    def collect(self) -> Iterator[Metric]:
        snap = self._core.snapshot() if self._core is not None else None
        for name, doc, value in (
                ("prefix_cache_queries", "prompt tokens of requests first scheduled that "
                 "looked the prefix cache up", snap.prefix_cache_queries if snap else 0),
                ("prefix_cache_hits", "of those, the tokens the prefix cache gave",
                 snap.prefix_cache_hits if snap else 0)):
            family = CounterMetricFamily(P + name, doc, labels=self.labels)
            family.add_metric(self.label_values, value)
            yield family
        info = self.info_labels()
        if info is not None:
            family = GaugeMetricFamily(P + "cache_config_info", "KV cache settings (as "
                                       "labels)", labels=[*self.labels, *info])
            family.add_metric([*self.label_values, *info.values()], 1)
            yield family

    def describe(self) -> list[Metric]:
        """The names, for the registry's clash check (the info series' too)."""
        return [CounterMetricFamily(P + "prefix_cache_queries", ""),
                CounterMetricFamily(P + "prefix_cache_hits", ""),
                GaugeMetricFamily(P + "cache_config_info", "")]
