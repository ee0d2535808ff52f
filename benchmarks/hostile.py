"""Hostile connections held open beside benchmarks/soak.py's load, and /health timed
all the while.

  idle       connections that send nothing: the server closes each after its
             --header-timeout, and it is opened again at once (an attacker keeps the count);
  slowloris  connections that send a request head a byte every `dribble_s` and never
             finish it: the server answers 408 after its --header-timeout, and the
             client starts over;
  /health    a fresh connection every `health_interval_s`, timed from connect to the end
             of the answer (a probe with no 200 within HEALTH_TIMEOUT_S fails).

The attackers and the probe each run in a process of their own (`python hostile.py
attack|probe ...`, until their stdin closes, then one line of JSON): an attacker is not
on the server's machine, and a health checker is a process of its own. Sharing the
load's interpreter, or the attackers' event loop, a probe was timed waiting for its own
client (a thousand reconnections at once on the same loop), not for the server.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
        self.url = url
        self.dribble_s = dribble_s
        self.health_interval_s = health_interval_s
        self.report = HostileReport(idle, slowloris)
        self._children: list[subprocess.Popen[str]] = []

    def _spawn(self, *args: object) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), *map(str, args)]
        self._children.append(subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))

    def __enter__(self) -> HostileClients:
        self._spawn("probe", self.url, self.health_interval_s)
        if self.report.idle or self.report.slowloris:
            self._spawn("attack", self.url, self.report.idle, self.report.slowloris,
                        self.dribble_s)
        return self

    def __exit__(self, *exc: object) -> None:
        r = self.report
        for child in self._children:
            out, _ = child.communicate("", timeout=120)  # stdin closed: report and exit
            got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            if not got:
                r.note(f"a hostile child exited {child.returncode} with no report")
            for key, value in got.items():
                if key == "problems":
                    for problem in value:
                        r.note(problem)
                elif key not in ("idle", "slowloris"):
                    setattr(r, key, value)


class _Child:
    """One side of the hostile clients, in its own process: runs until stdin closes."""

    def __init__(self, url: str, idle: int = 0, slowloris: int = 0, dribble_s: float = 0.5,
                 health_interval_s: float = 0.0) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.address = (host, int(port))
        self.dribble_s = dribble_s
        self.health_interval_s = health_interval_s
        self.report = HostileReport(idle, slowloris)
        self._latencies: list[float] = []

    def run(self) -> dict[str, object]:
        raise_open_file_limit()
        asyncio.run(self._main())
        lat = sorted(self._latencies)
        r = self.report
        if self.health_interval_s:
            r.health_probes = len(lat) + r.health_failures
            if lat:
                r.health_max_s = lat[-1]
                r.health_p99_s = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            keys = ("health_probes", "health_failures", "health_max_s", "health_p99_s")
        else:
            keys = ("idle_opened", "idle_closed", "slowloris_opened", "slowloris_408",
                    "refused")
        return {k: getattr(r, k) for k in keys} | {"problems": r.problems}

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        stdin_closed = loop.run_in_executor(None, sys.stdin.read)
        if self.health_interval_s:
            tasks = [asyncio.ensure_future(self._health())]
        else:
            tasks = [asyncio.ensure_future(self._idle()) for _ in range(self.report.idle)]
            tasks += [asyncio.ensure_future(self._slowloris())
                      for _ in range(self.report.slowloris)]
        await stdin_closed
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


def main(argv: list[str]) -> None:
    role, url, *rest = argv
    if role == "probe":
        child = _Child(url, health_interval_s=float(rest[0]))
    else:
        child = _Child(url, int(rest[0]), int(rest[1]), float(rest[2]))
    print(json.dumps(child.run()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
