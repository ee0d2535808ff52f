"""One load run against an HTTP target, with its /metrics sampled alongside: what
`stepserve bench --target` and `stepserve sweep --target` both do per run.

The target's model is discovered from GET /v1/models (an unreachable target is a
BenchError before any request is sent). /metrics is scraped once before the first request
and every `metrics_interval_s` during the run; after the last request ends, one more
scrape once the target reports nothing running or waiting (counters are fed when
requests end), so counter deltas cover the whole run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from stepserve.bench.client import RequestRecord
from stepserve.bench.loadgen import HttpTarget, LoadPlan, interruptible, run_http
from stepserve.bench.scrape import Scraper, scrape_summary
from stepserve.bench.workload_options import BenchError
from stepserve.config.urls import check_http_url
from stepserve.host.cpu_share import CpuWatch
from stepserve.metrics.live_window import live_config
from stepserve.metrics.run_summary import RunSummary

SETTLE_TRIES = 10
SETTLE_PAUSE_S = 0.1


def check_url(url: str) -> str:
    """The --target URL without its trailing slash; UsageError when it is not one."""
    return check_http_url("--target", url)


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
    url = check_url(url)
    cpu = CpuWatch.start()  # this machine's view, for a target without CPU series
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits,
                                 headers=dict(headers or {})) as client:
        out.model = await discover_model(client, url, model)
        interruptible(lambda: plan.prompts.fit_to_model(out.model))
        target = HttpTarget(url, out.model, timeout_s, endpoint=plan.shape.endpoint)
        scraper = Scraper(url + "/metrics", metrics_interval_s) if metrics_interval_s > 0 \
            else None
        out.scraper = scraper
        # no usable /metrics: the run goes on without them (the summary says why)
        polling = scraper is not None and await scraper.start(client)
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
