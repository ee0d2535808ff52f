"""`--save-result`: a run as `vllm bench serve --save-result` writes it, so tools that read
vLLM results read ours; and a vLLM result read back as a BenchResult (`stepserve report`).
The file goes in `--result-dir` (default: here) under `--result-filename` (default: vLLM's
`{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`); `SaveOptions` holds the flags.

The flat keys and their definitions are vLLM's (vllm/benchmarks/serve.py), over the
measured requests that were sent (warm-up and requests never sent are left out), from
the figures the bench summary is written from (results.MeasuredRequests):

  duration        first send to the last response's end, s
  completed       requests that ended by stop or length; failed: the others sent
  total_input_tokens, total_output_tokens   over completed requests (the server's usage
                  counts; without usage the prompt's planned length and one token per chunk)
  request_throughput = completed / duration; request_goodput = completed requests
                  meeting every --goodput SLO / duration (None without --goodput);
                  output_throughput = output tokens / duration; total_token_throughput =
                  (input + output tokens) / duration
  {mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms   for the --percentile-metrics and
                  --metric-percentiles asked; over completed requests: TTFT = first
                  token - send, E2EL = last token - send, TPOT = (E2EL - TTFT) / (output
                  tokens - 1) for outputs over one token, ITL = every gap between two
                  chunks; std is the population's; 0.0 where there is no value (as numpy
                  gives for vLLM's empty lists)
  max_output_tokens_per_s, max_concurrent_requests   over one-second buckets from the
                  first completed request's send: the most chunks in a bucket, and the
                  most completed requests active in one
  with --save-detailed, per sent request: input_lens, output_lens (0 when failed),
                  ttfts and itls (seconds, as vLLM), generated_texts, errors ("" when ok)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepserve.bench.client import RequestRecord
from stepserve.bench.prefix_cache import prompt_tokens
from stepserve.bench.results import (
    BenchResult,
    BenchRun,
    GoodputSLO,
    MeasuredRequests,
    e2e_s,
    itl_s,
    json_float,
    ttft_s,
)
from stepserve.config.errors import UsageError
from stepserve.config.user_files import check_output_dir, check_output_file, write_atomic
from stepserve.metrics.percentiles import mean, percentile
from stepserve.metrics.rules import findings_for
from stepserve.metrics.summary import sample_set
from stepserve.metrics.vllm_summary import vllm_summary

if TYPE_CHECKING:
    from stepserve.bench.job import BenchOptions

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM's default for generation
DEFAULT_METRIC_PERCENTILES = (99.0,)
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


@dataclass(frozen=True)
class VllmSetup:
    """The keys vLLM writes before the metrics: the run's setup."""

    backend: str
    model_id: str
    tokenizer_id: str
    num_prompts: int
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    label: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    date: str = ""  # %Y%m%d-%H%M%S; empty: now

    def to_json(self) -> dict[str, Any]:
        return {"date": self.date or datetime.now().strftime("%Y%m%d-%H%M%S"),
                "endpoint_type": self.backend, "backend": self.backend, "label": self.label,
                "model_id": self.model_id, "tokenizer_id": self.tokenizer_id,
                "num_prompts": self.num_prompts, **self.metadata,
                "request_rate": json_float(self.request_rate), "burstiness": self.burstiness,
                "max_concurrency": self.max_concurrency}

    def filename(self) -> str:
        """vLLM's default: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json."""
        cap = f"-concurrency{self.max_concurrency}" if self.max_concurrency is not None else ""
        date = self.to_json()["date"]
        return (f"{self.label or self.backend}-{float(self.request_rate)}qps{cap}-"
                f"{self.model_id.split('/')[-1]}-{date}.json")


def vllm_setup(options: BenchOptions, run: BenchRun) -> VllmSetup:
    """The setup keys of the `--save-result` file."""
    load = run.load or {}
    model = run.model or options.model or str(run.target)
    return VllmSetup(
        backend=options.backend, model_id=model,
        tokenizer_id=options.workload.tokenizer or model,
        num_prompts=int(load.get("num_prompts", 0)),
        request_rate=float(load.get("request_rate", math.inf)),
        burstiness=float(load.get("burstiness", 1.0)),
        max_concurrency=load.get("max_concurrency"), label=options.save.label,
        metadata=options.save.metadata)


def _stats(values: list[float]) -> tuple[float, float, float]:
    """(mean, median, population std) in seconds; zeros for no values, as numpy gives
    for vLLM's `values or 0`."""
    if not values:
        return 0.0, 0.0, 0.0
    m = mean(values) or 0.0
    return m, percentile(values, 50) or 0.0, math.sqrt(sum((v - m) ** 2 for v in values)
                                                        / len(values))


def peak_buckets(done: Sequence[RequestRecord]) -> tuple[float, int]:
    """(most chunks in one second, most requests active in one second), seconds counted
    from the first completed request's send."""
    spans = [(r.send_s, r.send_s + e) for r in done
             if r.send_s is not None and (e := e2e_s(r)) is not None]
    if not spans:
        return 0.0, 0
    start = min(s for s, _ in spans)
    n = int(math.ceil(max(e for _, e in spans) - start)) + 1
    tokens, active = [0] * n, [0] * n
    for r in done:
        for t in r.chunk_times_s:
            if 0 <= (k := int(t - start)) < n:
                tokens[k] += 1
    for s, e in spans:
        for k in range(int(s - start), int(e - start) + 1):
            active[k] += 1
    return float(max(tokens)), max(active)


def vllm_metrics(records: Sequence[RequestRecord], slo: GoodputSLO | None = None,
                 metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
                 percentiles: Sequence[float] = DEFAULT_METRIC_PERCENTILES
                 ) -> dict[str, Any]:
    """The metric keys of vLLM's result (the module doc) from a run's records."""
    m = MeasuredRequests.of(records)
    sent, done, duration = m.sent, m.done, m.duration_s
    total_in, total_out = m.input_tokens, m.output_tokens
    slo = slo or GoodputSLO()

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    peak_tokens, peak_active = peak_buckets(done)
    out: dict[str, Any] = {
        "duration": duration, "completed": len(done), "failed": len(sent) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(len(done)),
        "request_goodput": None if slo.empty else per_s(m.good(slo)),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "input_lens": [prompt_tokens(r) for r in sent],
        "output_lens": [r.num_output_tokens if r.ok else 0 for r in sent],
        "ttfts": [ttft_s(r) or 0.0 for r in sent],
        "itls": [itl_s(r) for r in sent],
        "generated_texts": [r.generated_text for r in sent],
        "errors": ["" if r.ok else (r.error or r.outcome) for r in sent],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_active}
    values = m.latency_values()
    values["e2el"] = values.pop("e2e")
    for name in PERCENTILE_METRICS:  # vLLM's order, whatever order they were asked in
        if name not in metrics:
            continue
        mean_s, median, std = _stats(values[name])
        out[f"mean_{name}_ms"], out[f"median_{name}_ms"] = mean_s * 1000, median * 1000
        out[f"std_{name}_ms"] = std * 1000
        for p in percentiles:
            value = percentile(values[name], p) if values[name] else 0.0
            out[f"p{int(p) if int(p) == p else p}_{name}_ms"] = (value or 0.0) * 1000
    return out


def vllm_result(setup: VllmSetup, metrics: Mapping[str, Any], detailed: bool = False
                ) -> dict[str, Any]:
    """The file's object: the setup, then the metrics (per-request lists only when
    `detailed`, as vLLM's --save-detailed)."""
    out = {**setup.to_json(), **metrics}
    if not detailed:
        for key in DETAILED_KEYS:
            out.pop(key, None)
    return out


def bench_result_from_vllm(data: Mapping[str, Any], name: str = "vllm") -> BenchResult:
    """A vLLM result file as a one-run BenchResult (for `stepserve report`): its summary,
    and its latency samples when the file has the per-request lists."""
    summary = vllm_summary(data)
    ttfts, itls, errors = (data.get(k) for k in ("ttfts", "itls", "errors"))
    samples = None
    if isinstance(ttfts, list) and isinstance(itls, list) and isinstance(errors, list):
        ok = [i for i, e in enumerate(errors) if e == "" and i < min(len(ttfts), len(itls))]
        ttft = [float(ttfts[i]) for i in ok]
        e2e = [float(ttfts[i]) + float(sum(itls[i])) for i in ok]
        samples = sample_set(ttft, e2e, len(ok))
    label = data.get("label") or data.get("backend") or name
    run = BenchRun(str(label), summary, target="vllm bench result",
                   model=None if data.get("model_id") is None else str(data["model_id"]),
                   latency_samples=samples)
    return BenchResult([run], findings_for([run]))


# ---- the flags and the writer ----

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
    metrics = vllm_metrics(records, slo, options.percentile_metrics, options.metric_percentiles)
    path = options.path(setup)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(vllm_result(setup, metrics, options.detailed)))
    return path
