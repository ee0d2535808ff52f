"""One scrape of a server's `/metrics` (`fetch_snapshot`, for `doctor --url` and `bench`),
bounded whatever a slow, broken or hostile server does: `ScrapeLimits` caps the whole
scrape's time (not a wait per read), the body as read after gzip is undone (counted as it
streams in), and the sample lines (counted before parsing, which takes ~60 us a line).
Past a limit the scrape fails with a LiveScrapeError naming it. A real server's page is
far inside them: vLLM's is a few thousand series, a few hundred KB.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass

import httpx

from stepserve.metrics.prometheus import KNOWN_PREFIXES, Snapshot, parse_prometheus, sample_lines


@dataclass(frozen=True)
class ScrapeLimits:
    deadline_s: float = 5.0
    max_body_bytes: int = 16 << 20  # 16 MiB: some 100,000 lines of vLLM's length
    max_series: int = 50_000  # ten times a cluster ingress's merged page


SCRAPE_LIMITS = ScrapeLimits()


class LiveScrapeError(Exception):
    """The target cannot be scraped: unreachable, an HTTP error, a limit passed, or no
    known metrics."""


async def fetch_snapshot(client: httpx.AsyncClient, url: str,
                         limits: ScrapeLimits | None = None) -> Snapshot:
    """One scrape of `url` (a /metrics URL) within `limits` (SCRAPE_LIMITS by default,
    read at each call); LiveScrapeError saying what went wrong."""
    limits = limits or SCRAPE_LIMITS
    try:
        body = await asyncio.wait_for(_get(client, url, limits), limits.deadline_s)
    except asyncio.TimeoutError:
        raise LiveScrapeError(f"{url} did not send its metrics within {limits.deadline_s:g} "
                              "s, the deadline of a whole scrape") from None
    except httpx.HTTPError as e:
        raise LiveScrapeError(f"cannot reach {url} ({type(e).__name__}: {e}); expected a "
                              "running server that serves Prometheus metrics there") from None
    t_s = time.monotonic()
    # parsing takes a while on a big page: off the event loop, which may be sending load
    non_finite: set[str] = set()
    samples = await asyncio.to_thread(_parse, url, body.decode("utf-8", "replace"), limits,
                                      non_finite)
    snap = Snapshot(t_s, samples, tuple(sorted(non_finite)))
    if snap.source() is None:
        raise LiveScrapeError(f"{url} has no series with a known prefix ({KNOWN_PREFIXES}); "
                              "expected the /metrics of stepserve, vLLM, SGLang or TGI")
    return snap


async def _get(client: httpx.AsyncClient, url: str, limits: ScrapeLimits) -> bytes:
    headers = {"Accept-Encoding": "gzip"}  # the one compression Prometheus servers use
    async with client.stream("GET", url, headers=headers,
                             timeout=limits.deadline_s) as resp:
        if resp.status_code != 200:
            raise LiveScrapeError(f"{url} answered HTTP {resp.status_code}; expected 200 "
                                  "with Prometheus metrics")
        return await _read_body(resp, url, limits.max_body_bytes)


async def _read_body(resp: httpx.Response, url: str, cap: int) -> bytes:
    """The body with its Content-Encoding undone, at most `cap` bytes of it (and of what
    came over the wire)."""
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        inflate = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if "gzip" in encoding
                                     else zlib.MAX_WBITS)
    else:
        raise LiveScrapeError(f"{url} sent its metrics as {encoding!r}; expected them "
                              "plain or gzip")
    parts: list[bytes] = []
    size = wire = 0
    try:
        async for raw in resp.aiter_raw():
            wire += len(raw)
            data = raw
            while data:
                piece = data if inflate is None else inflate.decompress(data, cap - size + 1)
                data = b"" if inflate is None else inflate.unconsumed_tail
                size += len(piece)
                if size > cap or wire > cap:
                    raise LiveScrapeError(f"{url} sent more than {cap:,} bytes of metrics"
                                          f"{'' if inflate is None else ' (unpacked)'}; a "
                                          "scrape reads at most that")
                parts.append(piece)
    except zlib.error as e:
        raise LiveScrapeError(f"{url} sent a broken {encoding} body ({e})") from None
    return b"".join(parts)


def _parse(url: str, text: str, limits: ScrapeLimits, non_finite: set[str]) -> dict:
    series = len(sample_lines(text))
    if series > limits.max_series:
        raise LiveScrapeError(f"{url} has {series:,} series, more than the "
                              f"{limits.max_series:,} a scrape reads")
    try:
        return parse_prometheus(text, non_finite)
    except Exception as e:  # a text the parser cannot read at all is a failed scrape
        raise LiveScrapeError(f"{url} sent unreadable metrics text ({type(e).__name__}: "
                              f"{e})") from None
