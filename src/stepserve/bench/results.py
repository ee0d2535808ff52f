"""Metrics from request records, with vLLM's definitions; a bench run's result types
(BenchRun, BenchResult) and their writers, `--save-result`'s vLLM file among them.

Per request (sent at `send_s`, chunk times t_1..t_k, n output tokens):
    TTFT = t_1 - send;  E2E = t_k - send (end of the response when no chunk came)
    TPOT = (E2E - TTFT) / (n - 1) for n >= 2;  ITL = every gap t_{i+1} - t_i
Latencies come from completed requests (finish reason stop or length) only; warm-up
requests are left out of everything. Duration is from the first measured send to the
last measured end. Goodput = completed requests meeting every SLO / duration, the SLOs
as `vllm bench serve --goodput` takes them: `ttft:500 tpot:50 e2el:2000` (milliseconds).
prefix_cache_hit_rate is absent (not 0) where the answers did not say how many prompt
tokens were cached. A run's `timeseries` has one row per /metrics sample of the target,
t from the first (taken before the load): the levels, and per interval the counters'
increases; without samples there is none.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import SCRAPE_KEYS, LoadPlan
from stepserve.config.errors import UsageError
from stepserve.config.user_files import check_output_dir, check_output_file, write_atomic
from stepserve.metrics.percentiles import mean, percentile, ratio
from stepserve.metrics.prometheus import Snapshot, counter_delta
from stepserve.metrics.request_metrics import stream_latencies
from stepserve.metrics.rules import Finding, RuleSettings, findings_for
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.schema import SCHEMA_KEY, SCHEMA_VERSION, check_schema
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import LatencySamples, latency_fields, sample_set
from stepserve.metrics.vllm_summary import vllm_summary
from stepserve.workload.arrivals import Constant, Gamma
from stepserve.workload.spec import Workload

if TYPE_CHECKING:
    from stepserve.bench.job import BenchOptions

T = TypeVar("T")
LATENCY_NAMES = ("ttft", "tpot", "itl", "e2e")
SUMMARY_KEYS_ORDER = ("requests_total", "requests_finished", "requests_failed",
                      "output_tokens", "duration_s", "throughput_tokens_per_s",
                      "throughput_requests_per_s", "goodput_requests_per_s",
                      "peak_concurrency")


GOODPUT_KEYS = ("ttft", "tpot", "e2el")


class GoodputError(ValueError):
    """A goodput string that does not parse; the message names the token."""


@dataclass(frozen=True)
class GoodputSLO:
    """Per-request latency limits for goodput, in seconds; None: not constrained. (A sweep's
    `--slo` is another thing: a limit on one metric of a run's summary, sweep/spec.py.)"""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2el_s is None

    def met(self, ttft_s: float | None, tpot_s: float | None, e2el_s: float | None) -> bool:
        """Every given limit is met. A TPOT limit is met by a one-token request (TPOT is
        undefined there, as vLLM treats it: 0)."""
        checks = ((self.ttft_s, ttft_s), (self.tpot_s, tpot_s if tpot_s is not None else 0.0),
                  (self.e2el_s, e2el_s))
        return all(limit is None or (value is not None and value <= limit)
                   for limit, value in checks)

    def describe(self) -> str:
        parts = [f"{k}<={v * 1000:g}ms" for k, v in
                 (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2el", self.e2el_s))
                 if v is not None]
        return " ".join(parts) or "none"


def parse_goodput(tokens: str | Iterable[str] | None) -> GoodputSLO:
    """`"ttft:500 tpot:50"` or `["ttft:500", "tpot:50"]` (ms) -> GoodputSLO (seconds)."""
    if tokens is None:
        return GoodputSLO()
    if isinstance(tokens, str):
        tokens = [tokens]
    values: dict[str, float] = {}
    allowed = ", ".join(GOODPUT_KEYS)
    for token in (t for chunk in tokens for t in chunk.replace(",", " ").split()):
        key, sep, raw = token.partition(":")
        key = key.strip().lower()
        if not sep:
            raise GoodputError(f"--goodput {token!r}: expected KEY:MILLISECONDS (keys: {allowed})")
        if key not in GOODPUT_KEYS:
            raise GoodputError(f"--goodput {token!r}: unknown key {key!r} (keys: {allowed})")
        if key in values:
            raise GoodputError(f"--goodput {token!r}: {key} given twice")
        try:
            ms = float(raw)
        except ValueError:
            raise GoodputError(f"--goodput {token!r}: {raw!r} is not a number of milliseconds "
                           f"(keys: {allowed})") from None
        if not math.isfinite(ms) or ms <= 0:
            raise GoodputError(f"--goodput {token!r}: the limit must be a positive number of "
                           "milliseconds")
        values[key] = ms / 1000.0
    return GoodputSLO(values.get("ttft"), values.get("tpot"), values.get("e2el"))


def _latencies(r: RequestRecord) -> tuple[float | None, float | None, float | None]:
    """(TTFT, E2E, TPOT) of a record on the client's clock; all None if never sent."""
    if r.send_s is None:
        return None, None, None
    return stream_latencies(r.send_s, r.chunk_times_s, r.end_s, r.num_output_tokens)


def ttft_s(r: RequestRecord) -> float | None:
    return _latencies(r)[0]


def e2e_s(r: RequestRecord) -> float | None:
    return _latencies(r)[1]


def tpot_s(r: RequestRecord) -> float | None:
    return _latencies(r)[2]


def itl_s(r: RequestRecord) -> list[float]:
    t = r.chunk_times_s
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once ([send, end) intervals; an end at the same instant
    as a send frees its slot first)."""
    events = []
    for r in records:
        if r.send_s is not None and r.end_s is not None:
            events += [(r.send_s, 1), (r.end_s, -1)]
    peak = live = 0
    for _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


def prefix_cache_fields(done: Sequence[RequestRecord]) -> RunSummary:
    """The hit rate over the completed requests whose answer counted its cached tokens,
    and the repeated share over those the bench knows the prompts of; each only when
    there is a request to count it over."""
    values: dict[str, float | None] = {}
    for key, tokens in (("prefix_cache_hit_rate", "cached_tokens"),
                        ("prefix_repeated_share", "repeated_tokens")):
        if counted := [r for r in done if getattr(r, tokens) is not None]:
            values[key] = ratio(sum(getattr(r, tokens) for r in counted),
                                sum(prompt_tokens(r) for r in counted))
    return RunSummary.of(**values)


def prompt_tokens(r: RequestRecord) -> int:
    return r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len


@dataclass(frozen=True)
class MeasuredRequests:
    """A run's measured requests (warm-up left out): those sent, those of them completed
    (stop or length), the duration from the first send to the last end, and the figures
    every view of the run (the summary, vLLM's result file) is written from."""

    measured: list[RequestRecord]
    sent: list[RequestRecord]
    done: list[RequestRecord]
    duration_s: float

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> MeasuredRequests:
        measured = [r for r in records if not r.warmup]
        sent = [r for r in measured if r.send_s is not None]
        starts = [r.send_s for r in sent if r.send_s is not None]
        ends = [r.end_s for r in sent if r.end_s is not None]
        duration = max(ends) - min(starts) if starts and ends else 0.0
        return cls(measured, sent, [r for r in sent if r.ok], duration)

    @property
    def input_tokens(self) -> int:
        return sum(prompt_tokens(r) for r in self.done)

    @property
    def output_tokens(self) -> int:
        return sum(r.num_output_tokens for r in self.done)

    def good(self, slo: GoodputSLO) -> int:
        """Completed requests meeting every SLO."""
        return sum(1 for r in self.done if slo.met(ttft_s(r), tpot_s(r), e2e_s(r)))

    def latency_values(self) -> dict[str, list[float]]:
        """Each latency's values over completed requests: TTFT, TPOT (outputs over one
        token), every ITL gap, E2E."""
        done = self.done
        return {"ttft": [v for r in done if (v := ttft_s(r)) is not None],
                "tpot": [v for r in done if (v := tpot_s(r)) is not None],
                "itl": [g for r in done for g in itl_s(r)],
                "e2e": [v for r in done if (v := e2e_s(r)) is not None]}


def summarize_records(records: Sequence[RequestRecord], slo: GoodputSLO | None = None,
                      scrape: RunSummary | None = None, interrupted: bool = False
                      ) -> RunSummary:
    slo = slo or GoodputSLO()
    m = MeasuredRequests.of(records)
    sent, done, duration = m.sent, m.done, m.duration_s
    errors = Counter(r.outcome for r in sent if not r.ok)
    good = None if slo.empty else m.good(slo)
    client = RunSummary.of(
        requests_total=len(sent), requests_not_sent=len(m.measured) - len(sent),
        requests_finished=len(done), requests_failed=sum(errors.values()),
        errors=dict(sorted(errors.items())),
        error_examples={k: next(r.error for r in sent if r.outcome == k)
                        for k in sorted(errors)},
        output_tokens=m.output_tokens, prompt_tokens=m.input_tokens, duration_s=duration,
        throughput_tokens_per_s=ratio(m.output_tokens, duration),
        throughput_requests_per_s=ratio(len(done), duration),
        goodput_requests_per_s=None if good is None else ratio(good, duration),
        goodput_requests=good, goodput_slo=slo.describe(),
        **latency_fields(m.latency_values()), peak_concurrency=peak_concurrency(sent),
        warmup_requests=len(records) - len(m.measured), interrupted=interrupted)
    unscraped = RunSummary.of(**{k: 0 if k == "scrape_samples" else None for k in SCRAPE_KEYS})
    return client.updated(prefix_cache_fields(done)).updated(unscraped).updated(
        scrape or RunSummary())


# timeseries field -> the counter it is the per-interval increase of
INTERVAL_COUNTERS = {"preemptions": "preemptions", "prefill_tokens": "prompt_tokens",
                     "decode_tokens": "generation_tokens", "steps": "steps"}


def latency_samples(records: Sequence[RequestRecord]) -> LatencySamples:
    """TTFT and E2E of the completed, measured requests, thinned to SAMPLE_CAP each."""
    m = MeasuredRequests.of(records)
    values = m.latency_values()
    return sample_set(values["ttft"], values["e2e"], len(m.done))


def scrape_timeseries(snapshots: Sequence[Snapshot]) -> TimeSeries | None:
    """The sampled levels and per-interval counter increases; None with under 2 samples.
    A counter the target does not expose is left out (`steps`) or reads 0."""
    if len(snapshots) < 2:
        return None
    # the first row is the sample before the load (levels as seen, no increase yet)
    rows = [(snapshots[0], snapshots[0])] + list(zip(snapshots, snapshots[1:], strict=False))
    increase = {f: [counter_delta(a, b, c) for a, b in rows] for f, c in INTERVAL_COUNTERS.items()}
    counted = {f: [d or 0.0 for d in ds] for f, ds in increase.items()}
    return TimeSeries(t=[b.t_s - snapshots[0].t_s for _a, b in rows],
                      waiting=[b.level("waiting") or 0.0 for _a, b in rows],
                      running=[b.level("running") or 0.0 for _a, b in rows], kv_usage=None,
                      prefill_tokens=counted["prefill_tokens"],
                      decode_tokens=counted["decode_tokens"],
                      preemptions=counted["preemptions"],
                      steps=None if all(d is None for d in increase["steps"])
                      else counted["steps"])


def from_fields(cls: type[T], data: Mapping[str, Any], **read: Callable[[Any], Any]) -> T:
    """The dataclass `cls` from a JSON object keyed by its field names: each field the
    object has (the others keep their defaults), through its `read` function where one
    is given; a null stays None. Keys that name no field are left out."""
    values = {}
    for f in fields(cls):
        if f.name in data:
            value = data[f.name]
            values[f.name] = value if value is None or f.name not in read else read[f.name](value)
    return cls(**values)


def json_float(x: float) -> float | str:
    """A number as the result files write it: an infinite one as "inf"."""
    return "inf" if math.isinf(x) else x


def offered_load(options: BenchOptions, workload: Workload, plan: LoadPlan) -> dict[str, Any]:
    """The offered load, JSON-ready: rate, burstiness, concurrency cap, count, seed, the
    dataset and its lengths, and how the requests were sent."""
    w = options.workload
    arrival = workload.arrival
    rate = w.offered_rate()
    if rate is None:  # the workload's own arrivals; a closed loop or a trace: inf
        rate = getattr(arrival, "rate_per_s", math.inf)
    burstiness = w.burstiness
    if burstiness is None:
        burstiness = arrival.burstiness if isinstance(arrival, Gamma) else \
            math.inf if isinstance(arrival, Constant) else 1.0
    out: dict[str, Any] = {
        "request_rate": json_float(float(rate)), "burstiness": json_float(float(burstiness)),
        "max_concurrency": plan.concurrency, "num_prompts": len(plan.specs) - plan.warmup,
        "warmup": plan.warmup, "seed": workload.seed, "arrival": arrival.describe(),
        "duration_s": plan.duration_s}
    dataset = w.dataset()
    if dataset == "random":
        cls = workload.classes[0]
        out.update(dataset="random", input_len=cls.prompt.describe(),
                   output_len=cls.output.describe(), range_ratio=w.random_range_ratio or 0.0)
    elif dataset == "prefix_repetition":
        prefix_len, suffix_len, num_prefixes, output_len = w.prefix_repetition()
        out.update(dataset=dataset, prefix_len=prefix_len, suffix_len=suffix_len,
                   num_prefixes=num_prefixes, output_len=output_len)
    elif dataset == "sharegpt":
        out.update(dataset="sharegpt", dataset_path=w.sharegpt,
                   sharegpt_output_len=w.sharegpt_output_len)
    elif dataset == "mooncake":
        out.update(dataset=dataset, dataset_path=w.sharegpt, trace_slowdown=w.trace_slowdown)
    else:
        out["dataset"] = f"scenario {w.scenario}" if w.scenario else f"workload {w.workload}"
    sessions = {c.name: c.multi_turn.to_dict() for c in workload.classes if c.multi_turn}
    if sessions:  # num_prompts counts their turns; the arrivals time only first turns
        out.update(multi_turn=sessions,
                   sessions=sum(1 for s in plan.specs[plan.warmup:] if s.turn == 0))
    if options.target:
        out.update(endpoint=options.shape.endpoint, sampling=dict(options.shape.sampling))
    out["ignore_eos"] = plan.ignore_eos
    return out


@dataclass(frozen=True)
class BenchRun:
    """One bench run (or one point of a live sweep): the client's summary (with the
    target's /metrics, or the engine's own step fields), the target and what it publishes
    of its settings, and the plot data. A None field is absent from the JSON."""

    name: str
    summary: RunSummary
    target: str | None = None  # a URL, "sim" or "engine"
    model: str | None = None
    batching: str | None = None
    config: dict[str, Any] | None = None  # as the target publishes its settings
    cost_model: str | None = None
    workload: str | None = None
    latency_samples: LatencySamples | None = None
    timeseries: TimeSeries | None = None
    started_at: float | None = None
    load: dict[str, Any] | None = None  # the load offered (offered_load)

    def rule_settings(self) -> RuleSettings:
        return RuleSettings.of(self.summary, self.config, self.batching)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for f in fields(self)[2:]:  # after name and summary, in their order
            if (value := getattr(self, f.name)) is not None:
                out[f.name] = value.to_json() if hasattr(value, "to_json") else value
        out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "run") -> BenchRun:
        return from_fields(cls, {"name": name, **data}, summary=RunSummary.from_json,
                           latency_samples=LatencySamples.from_json,
                           timeseries=TimeSeries.from_json)


@dataclass(frozen=True)
class BenchResult:
    runs: list[BenchRun]
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {SCHEMA_KEY: SCHEMA_VERSION, "runs": [r.to_json() for r in self.runs],
                "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "result") -> BenchResult:
        check_schema(data, where)
        return cls([BenchRun.from_json(r, f"run {i}") for i, r in enumerate(data["runs"])],
                   [Finding.from_json(f) for f in data.get("findings") or []])


# ---- writers ----

def write_json(path: str | Path, result: BenchResult) -> None:
    write_atomic(path, json.dumps(result.to_json(), indent=2, default=str))


CSV_FIELDS = ("index", "request_class", "warmup", "outcome", "status", "finish_reason",
              "prompt_len", "max_tokens", "output_tokens", "scheduled_s", "send_s", "end_s",
              "ttft_s", "tpot_s", "e2e_s", "itl_mean_s", "num_chunks", "error")


def write_csv(path: str | Path, records: Sequence[RequestRecord]) -> None:
    """One row per request, by index, under CSV_FIELDS."""
    out = io.StringIO(newline="")
    w = csv.writer(out)
    w.writerow(CSV_FIELDS)
    for r in sorted(records, key=lambda r: r.index):
        w.writerow([r.index, r.request_class, r.warmup, r.outcome, r.status,
                    r.finish_reason, r.prompt_len, r.max_tokens, r.num_output_tokens,
                    r.scheduled_s, r.send_s, r.end_s, ttft_s(r), tpot_s(r), e2e_s(r),
                    mean(itl_s(r)), len(r.chunk_times_s), r.error or ""])
    write_atomic(path, out.getvalue())


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def table_rows(s: RunSummary) -> list[tuple[str, str]]:
    rows = [(k, _fmt(s.metric(k))) for k in SUMMARY_KEYS_ORDER]
    if s.errors:
        rows.append(("errors", _fmt(s.errors)))
        rows += [(f"  first {k}", (msg or "")[:120]) for k, msg in (s.error_examples or {}).items()]
    if s.goodput_requests_per_s is not None:
        rows.append(("goodput_slo", s.goodput_slo or ""))
    rows += [(k, f"{v:.1%}") for k in ("prefix_cache_hit_rate", "prefix_repeated_share")
             if (v := s.metric(k)) is not None]
    for name in LATENCY_NAMES:
        ms = [s.metric(f"{name}_{stat}_s") for stat in ("mean", "p50", "p95", "p99")]
        rows.append((f"{name} ms mean/p50/p95/p99",
                     " / ".join("-" if v is None else f"{v * 1000:.2f}" for v in ms)))
    rows += [(k, _fmt(v)) for k in SCRAPE_KEYS[:-2] if (v := s.metric(k)) is not None]
    if s.cpu_source is not None:
        cpu = [f"others {s.cpu_others_cores:.2f} of {s.cpu_usable or 0:g} cores"
               if s.cpu_others_cores is not None else "others -",
               f"waited {s.cpu_wait_share:.0%}" if s.cpu_wait_share is not None
               else "waited -"]
        if s.step_time_over_quiet is not None:
            cpu.append(f"steps {s.step_time_over_quiet:.2f}x quiet")
        rows.append((f"cpu ({s.cpu_source})", ", ".join(cpu)))
    if s.scrape_failures:
        rows.append(("scrape_failures", f"{s.scrape_failures:g} (skipped; the first: "
                     f"{(s.scrape_error or '')[:100]})"))
    return rows


def format_table(name: str, summary: RunSummary) -> str:
    rows = table_rows(summary)
    width = max(len(k) for k, _ in rows)
    title = f"bench {name}" + (" (interrupted: partial result)" if summary.interrupted else "")
    return "\n".join([title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows])


def write_markdown(path: str | Path, result: BenchResult) -> None:
    lines = []
    for run in result.runs:
        lines += [f"## {run.name}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in table_rows(run.summary)]
        lines.append("")
    if result.findings:
        lines += ["## findings", ""]
        lines += [f"- **{f.severity}** {f.rule}: {f.evidence}" for f in result.findings]
    write_atomic(path, "\n".join(lines) + "\n")


# ---- `--save-result`: the run as `vllm bench serve --save-result` writes it, so tools
# that read vLLM results read ours; in `--result-dir` (default: here) under
# `--result-filename` (default: vLLM's name, VllmSetup.filename) ----

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM's default for generation
DEFAULT_METRIC_PERCENTILES = (99.0,)
DETAILED_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
                 "errors")


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
    """vLLM's metric keys with its definitions (vllm/benchmarks/serve.py, as the module
    doc's), over the measured requests that were sent: token totals over completed ones,
    std the population's, 0.0 for no values (as numpy gives for vLLM's empty lists), the
    peaks of peak_buckets, the DETAILED_KEYS lists per sent request."""
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
        "latencies": [(e2e_s(r) if r.ok else None) or 0.0 for r in sent],
        # when each was sent, and how long it waited in the client for a slot first
        # (--max-concurrency): vLLM's start_time and client_queue_time
        "start_times": [r.send_s for r in sent],
        "queue_times": [max(0.0, r.send_s - r.scheduled_s) for r in sent],
        "generated_texts": [r.generated_text for r in sent],
        "errors": ["" if r.ok else (r.error or r.outcome) for r in sent],
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_active,
        "rtfx": 0.0}  # the inverse real-time factor of audio benchmarks: none here
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
