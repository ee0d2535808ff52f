"""Hostile connections held open beside benchmarks/soak.py's load, and /health timed
all the while.

  idle       connections that send nothing: the server closes each after its
             --header-timeout, and it is opened again at once (an attacker keeps the count);
  slowloris  connections that send a request head a byte every `dribble_s` and never
             finish it: the server answers 408 after its --header-timeout, and the
             client starts over;
  /health    a fresh connection every `health_interval_s`, timed from connect to the end
             of the answer (a probe with no 200 within HEALTH_TIMEOUT_S fails).

They run on their own thread and event loop, so the load's client does not slow the
probes (nor the probes the load).
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from dataclasses import dataclass, field

HEALTH_TIMEOUT_S = 10.0
HEALTH_GOAL_S = 1.0


@dataclass
class HostileReport:
    idle: int  # idle connections held
    slowloris: int  # slowloris connections held
    idle_opened: int = 0  # connections opened, the first ones and every reopening
    idle_closed: int = 0  # closed by the server (its header timeout, or displaced)
    slowloris_opened: int = 0
    slowloris_408: int = 0  # heads the server gave up on, with 408
    refused: int = 0  # connects that failed, or a 503 at the connection cap
    health_probes: int = 0
    health_failures: int = 0  # no 200 within HEALTH_TIMEOUT_S
    health_max_s: float = 0.0
    health_p99_s: float = 0.0
    problems: list[str] = field(default_factory=list)  # the first few, verbatim

    @property
    def health_ok(self) -> bool:
        return self.health_failures == 0 and self.health_max_s < HEALTH_GOAL_S

    def note(self, problem: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(problem)


def raise_open_file_limit() -> None:
    """A thousand connections need a thousand descriptors: the soft limit up to the hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class HostileClients:
    """`with HostileClients(url, idle, slowloris) as hostile:` ... `hostile.report`."""

    def __init__(self, url: str, idle: int, slowloris: int, dribble_s: float = 0.5,
                 health_interval_s: float = 0.25) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.address = (host, int(port))
        self.dribble_s = dribble_s
        self.health_interval_s = health_interval_s
        self.report = HostileReport(idle, slowloris)
        self._latencies: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> HostileClients:
        raise_open_file_limit()
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        lat = sorted(self._latencies)
        r = self.report
        r.health_probes = len(lat) + r.health_failures
        if lat:
            r.health_max_s = lat[-1]
            r.health_p99_s = lat[min(len(lat) - 1, int(0.99 * len(lat)))]

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        tasks = [asyncio.ensure_future(self._health())]
        tasks += [asyncio.ensure_future(self._idle()) for _ in range(self.report.idle)]
        tasks += [asyncio.ensure_future(self._slowloris())
                  for _ in range(self.report.slowloris)]
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.open_connection(*self.address)
        except OSError as e:
            self.report.refused += 1
            self.report.note(f"connect: {type(e).__name__}: {e}")
            await asyncio.sleep(0.1)  # as an attacker would, not to spin
            return None

    async def _idle(self) -> None:
        while True:
            pair = await self._connect()
            if pair is None:
                continue
            reader, writer = pair
            self.report.idle_opened += 1
            try:
                answer = await reader.read()  # until the server closes it
            except OSError:
                answer = b""
            finally:
                writer.close()
            self.report.idle_closed += 1
            if answer.startswith(b"HTTP/1.1 503"):
                self.report.refused += 1
            elif answer:
                self.report.note(f"an idle connection was answered: {answer[:60]!r}")

    async def _slowloris(self) -> None:
        while True:
            pair = await self._connect()
            if pair is None:
                continue
            reader, writer = pair
            self.report.slowloris_opened += 1
            answer = asyncio.ensure_future(reader.read())
            try:
                writer.write(b"GET /health HTTP/1.1\r\nHost: soak\r\nX-Slow: ")
                while not answer.done():
                    await asyncio.wait([answer], timeout=self.dribble_s)
                    if not answer.done():
                        writer.write(b"x")
                got = answer.result()
            except OSError:
                got = b""
            finally:
                answer.cancel()
                writer.close()
            if got.startswith(b"HTTP/1.1 408"):
                self.report.slowloris_408 += 1
            elif got.startswith(b"HTTP/1.1 503"):
                self.report.refused += 1
            else:
                self.report.note(f"a slowloris connection ended with {got[:60]!r}")

    async def _health(self) -> None:
        while True:
            t0 = time.perf_counter()
            try:
                status = await asyncio.wait_for(self._probe(), HEALTH_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as e:
                status = f"{type(e).__name__}: {e}"
            if status == "200":
                self._latencies.append(time.perf_counter() - t0)
            else:
                self.report.health_failures += 1
                self.report.note(f"/health: {status}")
            await asyncio.sleep(self.health_interval_s)

    async def _probe(self) -> str:
        reader, writer = await asyncio.open_connection(*self.address)
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
        finally:
            writer.close()
        return answer[9:12].decode(errors="replace")
