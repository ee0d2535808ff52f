"""The two sides of benchmarks/soak.py. The server: `stepserve serve --model tiny` as a
subprocess, its /metrics and its RSS. The client: a seeded mix of streamed requests,
each run through the official `openai` async client under a deadline, and what became
of it.

Every request ends in exactly one outcome:
  completed  the stream carried a finish reason (stop or length) and ended;
  aborted    the client went away on purpose mid-stream (closed the stream, or cancelled
             the task reading it) before the final chunk arrived;
  rejected   an HTTP 4xx (429 included) before the stream began;
  error      an HTTP 5xx, or an error event in the stream;
  hung       no end of any kind within the deadline;
  lost       none of the above: the connection dropped or the stream ended without a
             final chunk (the server never answered).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from stepserve.metrics.prometheus import Samples, parse_prometheus

COMPLETED, ABORTED, REJECTED, ERROR, HUNG, LOST = (
    "completed", "aborted", "rejected", "error", "hung", "lost")
OUTCOMES = (COMPLETED, ABORTED, REJECTED, ERROR, HUNG, LOST)
P = "stepserve:"
DISCONNECT_MODES = ("close", "cancel")
# Prompts of 4..60 words (~10..140 tokens of the tiny model) plus at most 192 output
# tokens stay under the soak server's max_model_len of 512.
MAX_TOKENS = (1, 4, 8, 16, 32, 64, 96, 128, 192)
WORDS = ("the batch decode step memory block cache queue token prompt swap victim capital "
         "France quick brown fox jumps over lazy dog five dozen Paris Berlin one two three "
         "café Größe 東京").split()


# ---- the client ----

@dataclass(frozen=True)
class RequestPlan:
    """One request of the soak, fixed in advance by the seed."""

    index: int
    chat: bool  # /v1/chat/completions, else /v1/completions
    prompt: str
    max_tokens: int
    ignore_eos: bool
    temperature: float
    stop: str | None  # one the tiny model often emits, so some requests end on "stop"
    disconnect: str | None  # None, or how the client goes away: close | cancel
    after_chunks: int  # the client goes away once it has read this many chunks

    def describe(self) -> str:
        leaves = f", {self.disconnect} after {self.after_chunks} chunks" \
            if self.disconnect else ""
        return (f"{'chat' if self.chat else 'completion'}, {len(self.prompt.split())} words, "
                f"max_tokens {self.max_tokens}, ignore_eos {self.ignore_eos}, temperature "
                f"{self.temperature}, stop {self.stop!r}{leaves}")


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of OUTCOMES
    output_tokens: int = 0
    detail: str = ""  # why it did not complete, for the report


def make_plans(n: int, disconnect_fraction: float, seed: int) -> list[RequestPlan]:
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        leaves = rng.random() < disconnect_fraction
        # a disconnect needs a middle to happen in: at least 4 tokens asked for
        max_tokens = rng.choice([m for m in MAX_TOKENS if m >= 4] if leaves else MAX_TOKENS)
        plans.append(RequestPlan(
            index=i, chat=rng.random() < 0.5,
            prompt=" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))),
            max_tokens=max_tokens, ignore_eos=rng.random() < 0.5,
            temperature=rng.choice((0.0, 0.8)), stop="ces" if rng.random() < 0.2 else None,
            disconnect=rng.choice(DISCONNECT_MODES) if leaves else None,
            after_chunks=rng.randint(1, max(max_tokens // 2, 1))))
    return plans


async def _create(client: openai.AsyncOpenAI, model: str, plan: RequestPlan):
    common = dict(model=model, max_tokens=plan.max_tokens, temperature=plan.temperature,
                  seed=plan.index, stop=plan.stop, stream=True,
                  stream_options={"include_usage": True},
                  extra_body={"ignore_eos": plan.ignore_eos})
    if plan.chat:
        return await client.chat.completions.create(
            messages=[{"role": "user", "content": plan.prompt}], **common)
    return await client.completions.create(prompt=plan.prompt, **common)


async def _read(stream, plan: RequestPlan, reached: asyncio.Event | None) -> Outcome:
    """Read the stream to its end. At `plan.after_chunks` chunks, a "close" plan returns
    (its caller's `async with` closes the stream); a "cancel" plan sets `reached` and
    reads on until its caller cancels it."""
    n = tokens = 0
    finish = None
    async for chunk in stream:
        n += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        if finish is None and n >= plan.after_chunks:
            if plan.disconnect == "close":
                return Outcome(ABORTED)
            if reached is not None:
                reached.set()
    if finish in ("stop", "length"):
        return Outcome(COMPLETED, tokens)
    return Outcome(LOST, tokens, f"request {plan.index}: the stream ended without a final "
                                 f"chunk after {n} chunks ({plan.describe()})")


async def _read_then_cancel(stream, plan: RequestPlan) -> Outcome:
    reached = asyncio.Event()
    reader = asyncio.ensure_future(_read(stream, plan, reached))
    waiter = asyncio.ensure_future(reached.wait())
    try:
        await asyncio.wait((reader, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when the deadline cancels us: nothing is left reading
        waiter.cancel()
        reader.cancel()  # a no-op when the stream ended first
        await asyncio.wait((reader,))
    return Outcome(ABORTED) if reader.cancelled() else reader.result()


async def _stream_one(client: openai.AsyncOpenAI, model: str, plan: RequestPlan) -> Outcome:
    try:
        stream = await _create(client, model, plan)
        async with stream:  # closes the connection however the block is left
            if plan.disconnect == "cancel":
                return await _read_then_cancel(stream, plan)
            return await _read(stream, plan, None)
    except openai.APIStatusError as e:
        kind = REJECTED if 400 <= e.status_code < 500 else ERROR
        return Outcome(kind, detail=f"request {plan.index}: HTTP {e.status_code}: {e.message}")
    except openai.APIConnectionError as e:  # includes the client's own read timeout
        return Outcome(LOST, detail=f"request {plan.index}: {type(e).__name__} (cause "
                                    f"{e.__cause__!r}) ({plan.describe()})")
    except openai.APIError as e:  # an error event in the stream
        return Outcome(ERROR, detail=f"request {plan.index}: error event: {e.message}")
    except Exception as e:  # anything else is no answer either; the report shows it
        return Outcome(LOST, detail=f"request {plan.index}: {type(e).__name__}: {e}")


async def run_one(client: openai.AsyncOpenAI, model: str, plan: RequestPlan,
                  deadline_s: float) -> Outcome:
    try:
        return await asyncio.wait_for(_stream_one(client, model, plan), deadline_s)
    except asyncio.TimeoutError:
        return Outcome(HUNG, detail=f"request {plan.index}: no end within {deadline_s:g} s "
                                    f"({plan.describe()})")


async def run_load(base_url: str, model: str, plans: Sequence[RequestPlan], concurrency: int,
                   deadline_s: float) -> list[Outcome]:
    """Every plan, `concurrency` at a time (the next sent as soon as one ends)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0,
                                timeout=deadline_s + 30)  # the deadline fires first
    todo = iter(plans)
    outcomes: list[Outcome] = []

    async def worker() -> None:
        for plan in todo:
            outcomes.append(await run_one(client, model, plan, deadline_s))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return outcomes


# ---- the server ----

class ServerProcess:
    """`stepserve serve --model tiny` on 127.0.0.1 and a free port; stderr to a file (a
    pipe nobody reads could fill up and block the server)."""

    def __init__(self, flags: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile("w+")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepserve.cli", "serve", "--model", "tiny", "--port",
             str(port), "--log-level", "warning", "--shutdown-timeout", "5", *flags],
            stdout=subprocess.DEVNULL, stderr=self.log, env=env)

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up:\n{self.stderr()}")
            time.sleep(0.1)

    def samples(self) -> Samples:
        try:
            return parse_prometheus(httpx.get(self.url + "/metrics", timeout=10).text)
        except httpx.HTTPError:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server died (exit status {self.proc.returncode}):"
                                   f"\n{self.stderr()}") from None
            raise

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS in /proc status")

    def stop(self) -> int:
        """SIGINT (a graceful shutdown), a kill if that takes too long; the exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        finally:  # whatever happened above (even ^C), the server does not outlive us
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        return self.proc.returncode


def metric(samples: Samples, name: str) -> float:
    """`name` summed over its label sets."""
    return sum(v for (n, _), v in samples.items() if n == name)


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def increase(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Per label value, how much a counter grew (values that did not grow left out)."""
    grown = {k: round(v - before.get(k, 0.0)) for k, v in after.items()}
    return {k: v for k, v in grown.items() if v}


def ends_since(base: Samples, now: Samples) -> tuple[dict[str, int], dict[str, int]]:
    """Requests the server ended (by finished_reason) and rejected (by reason) between
    two scrapes."""
    ended, rejected = P + "request_success_total", P + "request_rejected_total"
    return (increase(by_label(base, ended, "finished_reason"),
                     by_label(now, ended, "finished_reason")),
            increase(by_label(base, rejected, "reason"), by_label(now, rejected, "reason")))


def wait_idle(server: ServerProcess, base: Samples, expected: int, timeout_s: float
              ) -> Samples:
    """Poll /metrics until nothing runs, waits, is swapped or holds a block, and the
    server has ended or rejected `expected` requests since `base`. Returns the last
    scrape, idle or not once `timeout_s` is up."""
    deadline = time.monotonic() + timeout_s
    levels = [P + n for n in ("num_requests_running", "num_requests_waiting",
                              "num_requests_swapped", "num_gpu_blocks_used")]
    while True:
        now = server.samples()
        ended, rejected = ends_since(base, now)
        total = sum(ended.values()) + sum(rejected.values())
        idle = not any(metric(now, name) for name in levels)
        if (idle and total >= expected) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)
