"""Metrics from request records, with vLLM's definitions; a bench run's result types
(BenchRun, BenchResult) and their writers.

Per request (sent at `send_s`, chunk times t_1..t_k, n output tokens):
    TTFT = t_1 - send;  E2EL = t_k - send (end of the response when no chunk came)
    TPOT = (E2EL - TTFT) / (n - 1) for n >= 2;  ITL = every gap t_{i+1} - t_i
Latencies come from completed requests (finish reason stop or length) only; warm-up
requests are left out of everything. Duration is from the first measured send to the
last measured end. Goodput = completed requests meeting every SLO / duration.

Summary fields (a RunSummary): requests_total (measured requests sent),
requests_not_sent (cut off by --duration-s or an interrupt), requests_finished,
requests_failed, errors (outcome -> count, e.g. http_500), error_examples (outcome -> its
first message), output_tokens (completed requests), prompt_tokens, duration_s,
throughput_tokens_per_s, throughput_requests_per_s, goodput_requests_per_s, goodput_slo,
{ttft,tpot,itl,e2e}_{mean,p50,p95,p99}_s, p99_p50_{e2e,ttft,tpot}_ratio,
peak_concurrency, warmup_requests, interrupted, and the scrape fields (scrape.py).
The prefix cache, over completed requests: prefix_cache_hit_rate where the answers said
how many prompt tokens were cached (usage.prompt_tokens_details.cached_tokens; absent,
not 0, from a server that does not say), prefix_repeated_share from the prompts the
bench built (prefix_cache.py). Whether the CPU was shared: the cpu_* fields
(host/cpu_share.py's CpuWatch, or the target's own: host/cpu_metrics.py).

Beside the summary a run records the load it offered (`load` in the bench JSON: rate,
burstiness, concurrency cap, count, seed, dataset and lengths, and how the requests were
sent) and its plot data, of the types `stepserve report` reads (as
metrics.summary.measure_run gives a simulation):

  latency_samples: TTFT and E2E of the completed, measured requests (client clock), thinned
      to SAMPLE_CAP order statistics;
  timeseries: one row per /metrics sample of the target, t in seconds from the first
      (taken before the load): waiting and running (levels), and per interval since the
      previous sample the preemptions, prompt tokens (as prefill_tokens), generation
      tokens (as decode_tokens) and, where the target counts them (stepserve:steps),
      engine steps. Without /metrics samples there is no timeseries.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import LoadPlan
from stepserve.bench.prefix_cache import prefix_cache_fields, prompt_tokens
from stepserve.bench.scrape import SCRAPE_KEYS, Snapshot
from stepserve.bench.slo import GoodputSLO
from stepserve.config.user_files import write_atomic
from stepserve.metrics.percentiles import mean, ratio
from stepserve.metrics.prometheus import counter_delta
from stepserve.metrics.request_metrics import stream_latencies
from stepserve.metrics.rules import Finding, RuleSettings
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.schema import SCHEMA_KEY, SCHEMA_VERSION, check_schema
from stepserve.metrics.step_metrics import TimeSeries
from stepserve.metrics.summary import SAMPLE_CAP, LatencySamples, latency_fields, sample_set
from stepserve.workload.arrivals import Constant, Gamma
from stepserve.workload.spec import Workload

if TYPE_CHECKING:
    from stepserve.bench.job import BenchOptions

LATENCY_NAMES = ("ttft", "tpot", "itl", "e2e")
SUMMARY_KEYS_ORDER = ("requests_total", "requests_finished", "requests_failed",
                      "output_tokens", "duration_s", "throughput_tokens_per_s",
                      "throughput_requests_per_s", "goodput_requests_per_s",
                      "peak_concurrency")


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


@dataclass(frozen=True)
class MeasuredRequests:
    """A run's measured requests (warm-up left out): those sent, those of them completed
    (stop or length), and the duration from the first send to the last end."""

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


def latency_values(done: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Each latency's values over completed requests: TTFT, TPOT (outputs over one
    token), every ITL gap, E2E."""
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
    output_tokens = sum(r.num_output_tokens for r in done)
    good = [r for r in done if slo.met(ttft_s(r), tpot_s(r), e2e_s(r))]
    client = RunSummary.of(
        requests_total=len(sent), requests_not_sent=len(m.measured) - len(sent),
        requests_finished=len(done), requests_failed=sum(errors.values()),
        errors=dict(sorted(errors.items())),
        error_examples={k: next(r.error for r in sent if r.outcome == k)
                        for k in sorted(errors)},
        output_tokens=output_tokens,
        prompt_tokens=sum(prompt_tokens(r) for r in done),
        duration_s=duration,
        throughput_tokens_per_s=ratio(output_tokens, duration),
        throughput_requests_per_s=ratio(len(done), duration),
        goodput_requests_per_s=ratio(len(good), duration) if not slo.empty else None,
        goodput_requests=len(good) if not slo.empty else None,
        goodput_slo=slo.describe(), **latency_fields(latency_values(done)),
        peak_concurrency=peak_concurrency(sent),
        warmup_requests=len(records) - len(m.measured), interrupted=interrupted)
    client = client.updated(prefix_cache_fields(done))
    unscraped = RunSummary.of(**{k: 0 if k == "scrape_samples" else None
                                 for k in SCRAPE_KEYS})
    return client.updated(unscraped).updated(scrape or RunSummary())


# ---- the plot data and the offered load a run records beside its summary ----

# timeseries field -> the counter it is the per-interval increase of
INTERVAL_COUNTERS = {"preemptions": "preemptions", "prefill_tokens": "prompt_tokens",
                     "decode_tokens": "generation_tokens", "steps": "steps"}


def latency_samples(records: Sequence[RequestRecord], cap: int = SAMPLE_CAP
                    ) -> LatencySamples:
    done = [r for r in records if r.ok and not r.warmup]
    ttft = [v for r in done if (v := ttft_s(r)) is not None]
    e2e = [v for r in done if (v := e2e_s(r)) is not None]
    return sample_set(ttft, e2e, len(done), cap)

def scrape_timeseries(snapshots: Sequence[Snapshot]) -> TimeSeries | None:
    """The sampled levels and per-interval counter increases; None with under 2 samples.
    A counter the target does not expose is left out (`steps`) or reads 0."""
    if len(snapshots) < 2:
        return None
    t0 = snapshots[0].t_s
    # the first row is the sample before the load (levels as seen, no increase yet)
    rows = [(snapshots[0], snapshots[0])] + list(zip(snapshots, snapshots[1:], strict=False))

    def level(key: str) -> list[float]:
        return [b.level(key) or 0.0 for _a, b in rows]

    def increase(field: str) -> list[float | None]:
        return [counter_delta(a, b, INTERVAL_COUNTERS[field]) for a, b in rows]

    def counted(field: str) -> list[float]:
        return [d or 0.0 for d in increase(field)]

    steps = increase("steps")
    return TimeSeries(t=[b.t_s - t0 for _a, b in rows], waiting=level("waiting"),
                      running=level("running"), kv_usage=None,
                      prefill_tokens=counted("prefill_tokens"),
                      decode_tokens=counted("decode_tokens"), preemptions=counted("preemptions"),
                      steps=None if all(d is None for d in steps) else [d or 0.0 for d in steps])


def http_extras(records: Sequence[RequestRecord], snapshots: Sequence[Snapshot]
                ) -> tuple[LatencySamples, TimeSeries | None]:
    """(latency samples, the /metrics time series or None) of a run against a target."""
    return latency_samples(records), scrape_timeseries(snapshots)


def _rate_and_burstiness(options: BenchOptions, workload: Workload) -> tuple[float, float]:
    rate = options.workload.offered_rate()
    arrival = workload.arrival
    if rate is None:  # the workload's own arrivals; a closed loop or a trace: inf
        rate = getattr(arrival, "rate_per_s", math.inf)
    burstiness = options.workload.burstiness
    if burstiness is None:
        burstiness = arrival.burstiness if isinstance(arrival, Gamma) else \
            math.inf if isinstance(arrival, Constant) else 1.0
    return float(rate), float(burstiness)


def json_float(x: float) -> float | str:
    """A number as the result files write it: an infinite one as "inf"."""
    return "inf" if math.isinf(x) else x


def offered_load(options: BenchOptions, workload: Workload, plan: LoadPlan
                 ) -> dict[str, Any]:
    """The offered load, JSON-ready (an infinite rate or burstiness as "inf")."""
    w = options.workload
    rate, burstiness = _rate_and_burstiness(options, workload)
    out: dict[str, Any] = {
        "request_rate": json_float(rate), "burstiness": json_float(burstiness),
        "max_concurrency": plan.concurrency, "num_prompts": len(plan.specs) - plan.warmup,
        "warmup": plan.warmup, "seed": workload.seed, "arrival": workload.arrival.describe(),
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
        for key in ("target", "model", "batching", "config", "cost_model", "workload"):
            if (value := getattr(self, key)) is not None:
                out[key] = value
        if self.latency_samples is not None:
            out["latency_samples"] = self.latency_samples.to_json()
        if self.timeseries is not None:
            out["timeseries"] = self.timeseries.to_json()
        if self.started_at is not None:
            out["started_at"] = self.started_at
        if self.load is not None:
            out["load"] = self.load
        out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "run") -> BenchRun:
        samples, ts = data.get("latency_samples"), data.get("timeseries")
        text = {k: None if data.get(k) is None else str(data[k])
                for k in ("target", "model", "batching", "cost_model", "workload")}
        config, load = data.get("config"), data.get("load")
        return cls(name=str(data.get("name", name)),
                   summary=RunSummary.from_json(data["summary"]), **text,
                   config=dict(config) if isinstance(config, dict) else None,
                   latency_samples=None if samples is None else LatencySamples.from_json(samples),
                   timeseries=None if ts is None else TimeSeries.from_json(ts),
                   started_at=data.get("started_at"),
                   load=dict(load) if isinstance(load, dict) else None)


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
    write_atomic(path, format_csv(records))


def format_csv(records: Sequence[RequestRecord]) -> str:
    """One row per request, by index, under CSV_FIELDS."""
    out = io.StringIO(newline="")
    w = csv.writer(out)
    w.writerow(CSV_FIELDS)
    for r in sorted(records, key=lambda r: r.index):
        gaps = itl_s(r)
        w.writerow([r.index, r.request_class, r.warmup, r.outcome, r.status,
                    r.finish_reason, r.prompt_len, r.max_tokens, r.num_output_tokens,
                    r.scheduled_s, r.send_s, r.end_s, ttft_s(r), tpot_s(r), e2e_s(r),
                    mean(gaps), len(r.chunk_times_s), r.error or ""])
    return out.getvalue()


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def cpu_row(s: RunSummary) -> str:
    """The cpu fields as one row of the bench table."""
    parts = [f"others {s.cpu_others_cores:.2f} of {s.cpu_usable or 0:g} cores"
             if s.cpu_others_cores is not None else "others -",
             f"waited {s.cpu_wait_share:.0%}" if s.cpu_wait_share is not None
             else "waited -"]
    if s.step_time_over_quiet is not None:
        parts.append(f"steps {s.step_time_over_quiet:.2f}x quiet")
    return ", ".join(parts)


def table_rows(summary: RunSummary) -> list[tuple[str, str]]:
    rows = [(k, _fmt(summary.metric(k))) for k in SUMMARY_KEYS_ORDER]
    if summary.errors:
        rows.append(("errors", _fmt(summary.errors)))
        for k, msg in (summary.error_examples or {}).items():
            rows.append((f"  first {k}", (msg or "")[:120]))
    if summary.goodput_requests_per_s is not None:
        rows.append(("goodput_slo", summary.goodput_slo or ""))
    for k in ("prefix_cache_hit_rate", "prefix_repeated_share"):
        if (value := summary.metric(k)) is not None:
            rows.append((k, f"{value:.1%}"))
    for name in LATENCY_NAMES:
        ms = [summary.metric(f"{name}_{s}_s") for s in ("mean", "p50", "p95", "p99")]
        rows.append((f"{name} ms mean/p50/p95/p99",
                     " / ".join("-" if v is None else f"{v * 1000:.2f}" for v in ms)))
    for k in SCRAPE_KEYS[:-2]:
        if (value := summary.metric(k)) is not None:
            rows.append((k, _fmt(value)))
    if summary.cpu_source is not None:
        rows.append((f"cpu ({summary.cpu_source})", cpu_row(summary)))
    if summary.scrape_failures:
        rows.append(("scrape_failures", f"{summary.scrape_failures:g} (skipped; the first: "
                     f"{(summary.scrape_error or '')[:100]})"))
    return rows


def format_table(name: str, summary: RunSummary) -> str:
    rows = table_rows(summary)
    width = max(len(k) for k, _ in rows)
    title = f"bench {name}" + (" (interrupted: partial result)" if summary.interrupted
                               else "")
    return "\n".join([title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows])


def format_markdown(result: BenchResult) -> str:
    lines = []
    for run in result.runs:
        lines += [f"## {run.name}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in table_rows(run.summary)]
        lines.append("")
    if result.findings:
        lines += ["## findings", ""]
        lines += [f"- **{f.severity}** {f.rule}: {f.evidence}" for f in result.findings]
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path, result: BenchResult) -> None:
    write_atomic(path, format_markdown(result))
