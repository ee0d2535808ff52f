"""A graceful shutdown's drain, shared by the single server's AsyncEngine and the
cluster ingress's ClusterEngine: both keep their live requests in a dict, set an Event
when it empties and another when a second shutdown signal cuts the drain short.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

log = logging.getLogger("stepserve.server")

ABORTED_END_WAIT_S = 10.0  # how long aborted requests get to hand over their final output


async def drain_live(live: Collection[str], all_ended: asyncio.Event,
                     drain_cut: asyncio.Event, abort: Callable[[str, str], None],
                     timeout_s: float) -> tuple[int, int]:
    """Let the requests in `live` finish for up to `timeout_s` (or until `drain_cut` is
    set), then abort the rest and wait for their ends. `live` is the engine's own table,
    read again after the wait (requests leave it as they end; the caller has already
    stopped admitting). Returns (finished during the drain, aborted)."""
    before = len(live)
    if before:
        waits = [asyncio.ensure_future(e.wait()) for e in (all_ended, drain_cut)]
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    left = list(live)
    for rid in left:
        abort(rid, f"server shutting down (no finish within the {timeout_s:g} s drain)")
    if left:
        try:
            await asyncio.wait_for(all_ended.wait(), ABORTED_END_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("%d requests did not end after their abort", len(live))
    return before - len(left), len(left)
