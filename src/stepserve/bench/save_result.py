"""`stepserve bench --save-result`'s options and writer: vLLM's flat result file
(bench/vllm_result.py) in `--result-dir` (default: here) under `--result-filename`
(default: vLLM's `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stepserve.bench.client import RequestRecord
from stepserve.bench.slo import GoodputSLO
from stepserve.bench.vllm_result import (
    DEFAULT_METRIC_PERCENTILES,
    DEFAULT_PERCENTILE_METRICS,
    PERCENTILE_METRICS,
    VllmSetup,
    vllm_metrics,
    vllm_result,
)
from stepserve.config.errors import UsageError
from stepserve.config.user_files import check_output_dir, check_output_file, write_atomic


@dataclass(frozen=True)
class SaveOptions:
    save: bool = False  # --save-result
    detailed: bool = False  # --save-detailed: the per-request lists too
    result_dir: str | None = None
    result_filename: str | None = None
    label: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES

    def check(self) -> None:
        """What can be refused before the run: the metric names, the percentiles, and
        where the file goes."""
        for name in self.percentile_metrics:
            if name not in PERCENTILE_METRICS:
                raise UsageError(f"--percentile-metrics {name!r}: allowed: "
                                 f"{', '.join(PERCENTILE_METRICS)}")
        for p in self.metric_percentiles:
            if not 0.0 <= p <= 100.0:
                raise UsageError(f"--metric-percentiles {p:g}: must be in [0, 100]")
        if self.save:
            check_output_dir("--result-dir", self.result_dir)
            if self.result_filename and self.result_dir is None:
                check_output_file("--result-filename", self.result_filename)

    def path(self, setup: VllmSetup) -> Path:
        name = Path(self.result_filename or setup.filename())
        return Path(self.result_dir) / name if self.result_dir else name


def parse_metric_names(text: str | None) -> tuple[str, ...]:
    """`ttft,tpot,itl` -> ("ttft", "tpot", "itl"); None: vLLM's default."""
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    return tuple(n.strip() for n in text.split(",") if n.strip())


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """`25,50,99` -> (25.0, 50.0, 99.0); None: vLLM's default (99)."""
    if text is None:
        return DEFAULT_METRIC_PERCENTILES
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--metric-percentiles {text!r}: expected numbers separated by "
                         "commas, e.g. 25,50,99") from None
    if not values or not all(math.isfinite(p) for p in values):
        raise UsageError(f"--metric-percentiles {text!r}: expected finite percentiles")
    return values


def save_vllm_result(options: SaveOptions, setup: VllmSetup,
                     records: Sequence[RequestRecord], slo: GoodputSLO) -> Path:
    """Write the file; its path."""
    metrics = vllm_metrics(records, slo, options.percentile_metrics,
                           options.metric_percentiles)
    path = options.path(setup)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(vllm_result(setup, metrics, options.detailed)))
    return path
