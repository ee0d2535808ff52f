"""What a server tells about itself, read once before the probes and at every scrape:
`/v1/models` (the served model, its folder `root`, `max_model_len`) and `/metrics` (the
engine its series' prefix names, the levels and counters a probe reads, the info gauges'
settings). Every failure to reach or read the server is a TargetError: one line naming
the URL and what was expected, never a traceback.
"""

from __future__ import annotations

import httpx

from stepserve.config.errors import UsageError
from stepserve.metrics.bounded_scrape import LiveScrapeError, fetch_snapshot
from stepserve.metrics.prometheus import Snapshot
from stepserve.profile.probe_figures import Scrape

MODELS = "/v1/models"
METRICS = "/metrics"


class TargetError(UsageError):
    """The target cannot be profiled: unreachable, refusing us, or not OpenAI-compatible."""


def answer_error(url: str, resp: httpx.Response) -> TargetError:
    """A non-200 answer as one line; a 401 or 403 names --api-key."""
    if resp.status_code in (401, 403):
        return TargetError(f"{url} answered HTTP {resp.status_code}: the server wants an API "
                           "key; pass it with --api-key")
    return TargetError(f"{url} answered HTTP {resp.status_code}; expected 200 from an "
                       "OpenAI-compatible server")


async def read_models(client: httpx.AsyncClient, base: str
                      ) -> list[tuple[str, str | None, int | None]]:
    """(id, root, max_model_len) of every model /v1/models lists (root and max_model_len
    None where the server does not say)."""
    url = base + MODELS
    try:
        resp = await client.get(url)
    except httpx.HTTPError as e:
        raise TargetError(f"cannot reach {url} ({type(e).__name__}: {e or 'no answer'}); "
                          "expected a running OpenAI-compatible server") from None
    if resp.status_code != 200:
        raise answer_error(url, resp)
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        data = None
    if not isinstance(data, list) or not data:
        raise TargetError(f"{url} lists no models; expected OpenAI's {{'data': [{{'id': "
                          "...}}]}}")
    out = []
    for card in data:
        if isinstance(card, dict) and isinstance(card.get("id"), str):
            root = card.get("root") if isinstance(card.get("root"), str) else None
            n = card.get("max_model_len")
            out.append((card["id"], root,
                        n if isinstance(n, int) and not isinstance(n, bool) and n > 1
                        else None))
    if not out:
        raise TargetError(f"{url}: no model there has an id")
    return out


async def scrape(client: httpx.AsyncClient, base: str, t0: float) -> Snapshot | None:
    """One scrape of base/metrics; None where the server has none we can read (a 404, no
    known prefix); a 401 or 403 is a TargetError, as the rest of the server will refuse
    too."""
    url = base + METRICS
    try:
        return await fetch_snapshot(client, url)
    except LiveScrapeError as e:
        if "HTTP 401" in str(e) or "HTTP 403" in str(e):
            raise TargetError(f"{url}: {e}; pass the server's key with --api-key") from None
        return None


def figures(snap: Snapshot | None, t_s: float) -> Scrape | None:
    """The series a probe reads, from one scrape (its time `t_s` on the probe clock)."""
    if snap is None:
        return None
    hist = snap.histogram("iteration_tokens")
    return Scrape(t_s, snap.level("running"), snap.level("waiting"), snap.level("kv_usage"),
                  snap.counter("steps"), None if hist is None else hist.sum,
                  None if hist is None else hist.count,
                  # +Inf left out: its count is iteration_tokens_count, and JSON has no inf
                  () if hist is None else tuple(b for b in hist.buckets
                                                 if b[0] != float("inf")),
                  snap.counter("prefix_cache_hits"))


def engine_kind(snap: Snapshot | None) -> str | None:
    """stepserve, vllm, sglang, tgi or llamacpp, from the series' prefix; None: no page."""
    src = None if snap is None else snap.source()
    return None if src is None else src.name
