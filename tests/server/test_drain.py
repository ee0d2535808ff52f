"""drain_live, the shutdown drain both engines share (AsyncEngine, ClusterEngine): what
ends within the timeout counts as finished, the rest is aborted, a cut ends the wait."""

from __future__ import annotations

import asyncio

from stepserve.server.async_engine import drain_live


class Live:
    """A table of live requests as the engines keep it: `all_ended` set when it empties;
    an abort takes `abort_delay_s` to end its request (None: never)."""

    def __init__(self, ids: list[str], abort_delay_s: float | None = 0.0) -> None:
        self.ids = dict.fromkeys(ids)
        self.all_ended = asyncio.Event()
        self.drain_cut = asyncio.Event()
        self.abort_delay_s = abort_delay_s
        self.aborted: list[tuple[str, str]] = []

    def end(self, rid: str) -> None:
        self.ids.pop(rid, None)
        if not self.ids:
            self.all_ended.set()

    def abort(self, rid: str, message: str) -> None:
        self.aborted.append((rid, message))
        if self.abort_delay_s is not None:
            asyncio.get_running_loop().call_later(self.abort_delay_s, self.end, rid)

    async def drain(self, timeout_s: float) -> tuple[int, int]:
        return await drain_live(self.ids, self.all_ended, self.drain_cut, self.abort,
                                timeout_s)


def test_nothing_live_returns_at_once():
    async def main():
        live = Live([])
        live.all_ended.set()
        return await live.drain(30.0), live.aborted

    assert asyncio.run(main()) == ((0, 0), [])


def test_what_ends_in_time_finishes_and_the_rest_is_aborted_and_awaited():
    async def main():
        live = Live(["a", "b", "c"], abort_delay_s=0.05)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, live.end, "a")  # finishes within the drain
        counts = await live.drain(0.2)
        return counts, live.aborted, dict(live.ids)

    counts, aborted, left = asyncio.run(main())
    assert counts == (1, 2)
    assert [rid for rid, _ in aborted] == ["b", "c"]
    assert all("0.2 s drain" in message for _, message in aborted)
    assert left == {}  # the drain waited for the aborted requests to end


def test_everything_ending_ends_the_wait_before_the_timeout():
    async def main():
        live = Live(["a"])
        asyncio.get_running_loop().call_later(0.01, live.end, "a")
        t0 = asyncio.get_running_loop().time()
        counts = await live.drain(30.0)
        return counts, asyncio.get_running_loop().time() - t0

    counts, waited = asyncio.run(main())
    assert counts == (1, 0)
    assert waited < 10.0


def test_a_cut_aborts_at_once():
    async def main():
        live = Live(["a", "b"])
        asyncio.get_running_loop().call_later(0.01, live.drain_cut.set)
        t0 = asyncio.get_running_loop().time()
        counts = await live.drain(30.0)
        return counts, asyncio.get_running_loop().time() - t0, live.aborted

    counts, waited, aborted = asyncio.run(main())
    assert counts == (0, 2)
    assert waited < 10.0
    assert {rid for rid, _ in aborted} == {"a", "b"}
