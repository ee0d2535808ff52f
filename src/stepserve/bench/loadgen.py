"""Issue a workload's requests against an HTTP target, as `vllm bench serve` does, with
the target's /metrics sampled alongside: one run of `bench --target` or `sweep --target`.

Each request is due at its arrival time; with a concurrency cap it then waits for a
slot, and its send time (TTFT's start) is when it goes out. A multi-turn session is one
task: each later turn goes `think_time_s` after the answer before it, and a turn not
answered in full ends the session; a user keeps their slot while thinking, as the
simulator's closed loop counts sessions. Records are filled in place, so an interrupt
keeps what was measured. /metrics (any server's names, metrics/prometheus.py) is scraped
before the first request, every `metrics_interval_s`, and once more when the target is
idle after the last (counters are fed when requests end); a failed scrape is skipped and
counted, never fatal, as `doctor --url` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from stepserve.bench.client import RequestRecord, RequestShape, stream_completion
from stepserve.bench.prompt_maker import Conversation, PromptMaker, repeated_tokens
from stepserve.bench.workload_options import BenchError
from stepserve.config.errors import UsageError
from stepserve.config.urls import check_http_url
from stepserve.host.cpu_metrics import cpu_window
from stepserve.host.cpu_share import CpuWatch
from stepserve.metrics.bounded_scrape import ScrapeLimits
from stepserve.metrics.live_window import ScrapeWindow, level_summary, live_config
from stepserve.metrics.prometheus import Snapshot, counter_delta, histogram_delta
from stepserve.metrics.run_summary import RunSummary
from stepserve.workload.sessions import next_turns, session_starts
from stepserve.workload.spec import RequestSpec

T = TypeVar("T")
SETTLE_TRIES = 10
SETTLE_PAUSE_S = 0.1


@dataclass
class LoadPlan:
    specs: Sequence[RequestSpec]
    concurrency: int | None = None  # at most this many in flight (None: no cap)
    warmup: int = 0  # the first `warmup` requests are excluded from metrics
    duration_s: float | None = None  # stop issuing after this (warm-up not counted)
    prompts: PromptMaker = field(default_factory=PromptMaker)  # text
    ignore_eos: bool = True
    shape: RequestShape = field(default_factory=RequestShape)


@dataclass
class HttpTarget:
    base_url: str
    model: str
    endpoint: str = "/v1/completions"


@dataclass
class SendWindow:
    """Whether a plan's request may still be sent: warm-up requests always go; the rest
    only until the plan's duration, timed on `clock` from the first measured one, has
    passed."""

    plan: LoadPlan
    clock: Callable[[], float]
    start: float | None = None

    def allows(self, i: int) -> bool:
        if self.plan.duration_s is None or i < self.plan.warmup:
            return True
        if self.start is None:
            self.start = self.clock()
        return self.clock() - self.start <= self.plan.duration_s


def make_records(plan: LoadPlan) -> list[RequestRecord]:
    repeated = repeated_tokens(plan.specs)
    return [RequestRecord(index=s.index, request_class=s.request_class,
                          prompt_len=s.prompt_len, max_tokens=s.max_tokens,
                          warmup=i < plan.warmup, scheduled_s=s.arrival_s,
                          repeated_tokens=repeated[i])
            for i, s in enumerate(plan.specs)]


def interruptible(work: Callable[[], T]) -> T:
    """`work()`, blocking the event loop's thread, with Ctrl-C raising KeyboardInterrupt
    inside it. asyncio.run's own handler only cancels the main task, and a cancel lands
    at the task's next await: after the blocking work (a tokenizer's first load imports
    torch, seconds and more on a busy machine), which is start-up seeming to ignore
    Ctrl-C. A SIGINT this process ignores (a shell's background job) stays ignored."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler) \
            or handler is signal.default_int_handler:
        return work()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return work()
    finally:  # asyncio.run's handler back (it restores the default itself when done)
        signal.signal(signal.SIGINT, handler)


async def run_http(target: HttpTarget, plan: LoadPlan, records: list[RequestRecord],
                   client: httpx.AsyncClient,
                   on_done: Callable[[RequestRecord], None] | None = None) -> None:
    """Send every request of `plan`, filling `records` (from make_records) in place.
    Prompts are built before the clock starts, so building them delays no send."""
    done = on_done or (lambda r: None)
    next_turn = next_turns(plan.specs)
    if next_turn and plan.prompts.token_ids:
        raise UsageError("multi_turn sessions send the answers back as text: drop "
                         "--token-id-prompts")
    starts = session_starts(plan.specs) if next_turn else range(len(plan.specs))
    prompts = interruptible(lambda: [plan.prompts(spec) for spec in plan.specs])
    t0 = time.perf_counter()
    window = SendWindow(plan, time.perf_counter)
    slots = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None
    url = target.base_url.rstrip("/") + target.endpoint

    async def send(i: int, body: dict) -> None:
        record = records[i]
        try:
            await stream_completion(client, url, body, record, t0)
        except asyncio.CancelledError:
            record.error = "interrupted before the response ended"
            record.end_s = time.perf_counter() - t0
            raise

    async def one(i: int) -> None:
        spec, record = plan.specs[i], records[i]
        body = plan.shape.body(target.model, prompts[i], spec.max_tokens, plan.ignore_eos)
        async with slots or contextlib.nullcontext():
            if not window.allows(i):
                return  # never sent
            if i in next_turn:
                return await session(i)
            await send(i, body)
        done(record)

    async def session(i: int | None) -> None:
        talk = Conversation(plan.shape.chat)
        while i is not None:
            spec, record = plan.specs[i], records[i]
            prompt = prompts[i]
            await send(i, talk.body(plan.shape, target.model, prompt, spec.max_tokens,
                                    plan.ignore_eos))
            done(record)
            i = next_turn.get(i)
            if i is None or not record.ok:
                return
            assert isinstance(prompt, str)
            talk.answered(prompt, record.generated_text)
            await asyncio.sleep(plan.specs[i].think_time_s)
            records[i].scheduled_s = time.perf_counter() - t0

    tasks: list[asyncio.Task] = []
    try:
        for i in starts:
            delay = plan.specs[i].arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None and not window.allows(i):
                break
            tasks.append(asyncio.create_task(one(i)))
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def discover_model(client: httpx.AsyncClient, url: str, model: str | None) -> str:
    """`model` if given, else the first id of GET /v1/models; BenchError when the target
    cannot be reached, refuses the key (401/403), or lists no model."""
    try:
        resp = await client.get(url + "/v1/models", timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach target {url}: {type(e).__name__}: {e}") from None
    if resp.status_code in (401, 403):
        raise BenchError(f"target {url}: GET /v1/models gave HTTP {resp.status_code}: pass "
                         "its key (OPENAI_API_KEY, --api-key or --header)")
    if model:
        return model
    try:
        return resp.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"target {url}: GET /v1/models gave HTTP {resp.status_code} "
                         "without a model list; pass --model NAME") from None


SCRAPE_KEYS = ("waiting_max", "running_max", "kv_usage_max", "preemptions",
               "waiting_p50", "waiting_nonzero_share", "waiting_growth", "waiting_trend_rise",
               "server_requests_finished", "server_generation_tokens",
               "server_prompt_tokens", "mean_step_s", "step_p50_s", "step_p99_s",
               "metrics_source", "scrape_samples")  # the two not numbers last
# summary key -> the counter whose increase over the run it is
_COUNTER_KEYS = {"preemptions": "preemptions", "server_requests_finished": "requests_finished",
                 "server_generation_tokens": "generation_tokens",
                 "server_prompt_tokens": "prompt_tokens"}


@dataclass
class Scraper(ScrapeWindow):
    """Polls `url` every `interval_s` until stopped; keeps every snapshot that worked and
    one line per scrape that failed."""

    url: str
    interval_s: float = 0.5
    limits: ScrapeLimits | None = None  # None: bounded_scrape.SCRAPE_LIMITS

    async def scrape_once(self, client: httpx.AsyncClient) -> Snapshot | None:
        """One scrape; None (and a line in `failures`) when it failed."""
        return await self.scrape(client, self.url, self.limits)

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                await self.scrape_once(client)

    def summary(self) -> dict:
        return scrape_summary(self.snapshots, self.failures)


def scrape_summary(snapshots: list[Snapshot], failures: Sequence[str] = ()) -> dict:
    """The SCRAPE_KEYS from snapshots in time order (first = before the run, last = after),
    and scrape_failures / scrape_error when some of `failures` (lines) are there."""
    out: dict = {k: None for k in SCRAPE_KEYS}
    out["scrape_samples"] = len(snapshots)
    if failures:
        out.update(scrape_failures=len(failures), scrape_error=failures[0])
    if not snapshots or (source := snapshots[0].source()) is None:
        return out
    out["metrics_source"] = source.name
    levels = level_summary(snapshots)
    out.update({k: v for k, v in levels.items() if k in out})
    first, last = snapshots[0], snapshots[-1]
    for key, counter in _COUNTER_KEYS.items():
        out[key] = counter_delta(first, last, counter)
    step_time = histogram_delta(first, last, "step_time")
    if step_time is not None and step_time.count:
        out.update(mean_step_s=step_time.mean, step_p50_s=step_time.quantile(0.5),
                   step_p99_s=step_time.quantile(0.99))
    if (cpu := cpu_window(first, last))["cpu_source"] is not None:
        out.update(cpu)  # the server's CPU sharing (host/cpu_metrics.py)
    return out


@dataclass
class HttpRun:
    """What one run against a target left: the model used and the /metrics samples."""

    model: str | None = None
    scraper: Scraper | None = None
    scrape: RunSummary = field(default_factory=RunSummary)  # the samples' SCRAPE_KEYS

    @property
    def snapshots(self) -> list:
        return self.scraper.snapshots if self.scraper else []

    def server_config(self) -> dict:
        """The scheduler settings the target publishes (stepserve:scheduler_config_info),
        so the doctor's advice can name them; {} when it publishes none."""
        return live_config(self.snapshots[-1]) if self.snapshots else {}


async def _settle(scraper: Scraper, client: httpx.AsyncClient) -> None:
    """Scrape until the target is idle; a failed scrape is skipped, two in a row end it
    (a target that went away is not waited on)."""
    failed = 0
    for _ in range(SETTLE_TRIES):
        snap = await scraper.scrape_once(client)
        failed = failed + 1 if snap is None else 0
        if failed >= 2:
            return
        if snap is not None and not any(snap.level(key) for key in ("running", "waiting")):
            return
        await asyncio.sleep(SETTLE_PAUSE_S)


async def bench_http(url: str, model: str | None, plan: LoadPlan,
                     records: list[RequestRecord], out: HttpRun, *,
                     timeout_s: float = 600.0, metrics_interval_s: float = 0.5,
                     on_done: Callable[[RequestRecord], None] | None = None,
                     headers: Mapping[str, str] | None = None) -> None:
    """Send `plan` to `url`, filling `records` in place and `out` as it goes, so an
    interrupt (CancelledError / KeyboardInterrupt) still leaves what was measured.
    `headers` (an API key, --header) go with every request, the scrapes included."""
    url = check_http_url("--target", url)  # without its trailing slash
    cpu = CpuWatch.start()  # this machine's view, for a target without CPU series
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits,
                                 headers=dict(headers or {})) as client:
        out.model = await discover_model(client, url, model)
        interruptible(lambda: plan.prompts.fit_to_model(out.model))
        target = HttpTarget(url, out.model, plan.shape.endpoint)
        scraper = Scraper(url + "/metrics", metrics_interval_s) if metrics_interval_s > 0 else None
        out.scraper = scraper
        # the scrape before the run, retried once; no usable /metrics: the run goes on
        # without them (the summary says why)
        polling = scraper is not None and await scraper.first(client, scraper.url, scraper.limits)
        stop = asyncio.Event()
        poll = asyncio.create_task(scraper.run(client, stop)) if polling else None
        try:
            await run_http(target, plan, records, client, on_done=on_done)
        finally:
            stop.set()
            if poll is not None:
                await asyncio.gather(poll, return_exceptions=True)
                await _settle(scraper, client)
            out.scrape = RunSummary.from_json(scrape_summary(
                out.snapshots, scraper.failures if scraper else ()))
            if out.scrape.cpu_source is None:
                out.scrape = out.scrape.with_values(**cpu.fields("client"))
