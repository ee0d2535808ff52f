"""`profile --target URL`'s probes: small, named steps of HTTP traffic to any
OpenAI-compatible server, each designed to separate one part of a step's time, with the
server's /metrics scraped before and after each (and during a decode rung).

In order, each within its share of the budget (SHARES; what one leaves passes on):

1. `floor`: one-token prompts, one token out, one at a time: the HTTP path's floor.
2. `prompt`: prompt-only requests (`max_tokens` 1) at doubling lengths up to
   max_model_len, alone; with a step counter on /metrics, a binary search for the longest
   prompt that still takes one step (the step token budget); then bursts of k at once.
3. `decode`: the decode ladder, k = 1, 2, 4, ... requests of a fixed output length at
   once, until `running` stops rising (max_num_seqs).
4. `mixed`: one long prompt sent into a running decode batch.
5. `repeat`: one prompt sent twice (prefix caching, and what a cached prefix costs).

Every prompt is new (token ids drawn from a seeded generator, one seed per prompt), so no
probe but `repeat` meets the prefix cache. Prompts go as token-id lists (`/v1/completions`
with `prompt: [ids]`) where the server takes them, else as text made by the tokenizer in
the folder /v1/models names as `root`. Output lengths are held with `ignore_eos` and
`min_tokens`; where the reported completion_tokens show the server did not honour them,
a note says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from stepserve.bench.client import (
    COMPLETIONS,
    RequestRecord,
    RequestShape,
    request_headers,
    stream_completion,
)
from stepserve.config.errors import UsageError
from stepserve.config.urls import check_http_url
from stepserve.profile import infer
from stepserve.profile.probe_figures import ProbeFigures, ProbeRun, Scrape, TargetInfo, Timing
from stepserve.profile.server_facts import TargetError, engine_kind, figures, read_models, scrape

MIN_BUDGET_S = 10.0
MAX_BUDGET_S = 3600.0
# share of the budget each probe may spend, in order
SHARES = (("floor", 0.05), ("prompt", 0.25), ("decode", 0.35), ("mixed", 0.15),
          ("repeat", 0.2))
ID_LO, ID_HI = 3, 500  # prompt token ids: inside any vocabulary, below its special tokens
MAX_LADDER = 1024  # decode rungs stop here (and at the budget)
SETTLE_TRIES = 10


@dataclass(frozen=True)
class TargetOptions:
    url: str
    api_key: str | None = None
    model: str | None = None  # None: the first of /v1/models
    budget_s: float = 180.0


def check_options(opts: TargetOptions) -> TargetOptions:
    """The options with the URL normalised; UsageError for a bad URL or budget."""
    url = check_http_url("--target", opts.url)
    if not MIN_BUDGET_S <= opts.budget_s <= MAX_BUDGET_S:
        raise UsageError(f"--budget-s {opts.budget_s:g}: too small to probe a server (the "
                         f"probes need at least {MIN_BUDGET_S:g} s); allowed: "
                         f"{MIN_BUDGET_S:g}..{MAX_BUDGET_S:g}"
                         if opts.budget_s < MIN_BUDGET_S else
                         f"--budget-s {opts.budget_s:g}: allowed: {MIN_BUDGET_S:g}.."
                         f"{MAX_BUDGET_S:g}")
    return replace(opts, url=url)


class BudgetSpent(TargetError):
    """The budget ran out before a probe had the least it needs."""


class Prober:
    """One probe run's state: the client, the clock, the prompts and what was recorded."""

    def __init__(self, client: httpx.AsyncClient, opts: TargetOptions,
                 progress: Callable[[str], None] | None = None) -> None:
        self.client, self.opts, self.progress = client, opts, progress
        self.base = opts.url
        self.t0 = time.perf_counter()
        self.end = self.t0 + opts.budget_s
        self.runs: list[ProbeRun] = []
        self.notes: list[str] = []
        self.seed = 0
        self.shape = RequestShape(sampling={"temperature": 0.0})
        self.exact = True  # ignore_eos and min_tokens are sent
        self.tokenizer = None  # for text prompts
        self.target = TargetInfo(opts.url, opts.model or "")
        self.has_metrics = False

    # ---- the clock and the budget ----

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def deadline(self, probe: str) -> float:
        """Probe-clock time by which `probe` should be done (cumulative shares)."""
        total = 0.0
        for name, share in SHARES:
            total += share
            if name == probe:
                break
        return total * self.opts.budget_s

    def check_budget(self, probe: str) -> None:
        if time.perf_counter() > self.end:
            raise BudgetSpent(f"--budget-s {self.opts.budget_s:g} is too small for this "
                              f"server: it ran out in the {probe} probe, before that probe "
                              "had its least; give more time")

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    # ---- prompts and requests ----

    def prompt_ids(self, n: int) -> list[int]:
        self.seed += 1
        rng = random.Random(self.seed * 7919 + 17)
        return [rng.randrange(ID_LO, ID_HI) for _ in range(max(1, n))]

    def prompt(self, ids: list[int]) -> list[int] | str:
        return ids if self.tokenizer is None else self.tokenizer.decode(ids)

    def body(self, prompt: list[int] | str, max_tokens: int) -> dict:
        body = self.shape.body(self.target.model, prompt, max_tokens, self.exact)
        if self.exact and max_tokens > 1:
            body["min_tokens"] = max_tokens
        return body

    async def start(self, ids: list[int], max_tokens: int) -> RequestRecord:
        rec = RequestRecord(0, prompt_len=len(ids), max_tokens=max_tokens)
        await stream_completion(self.client, self.base + COMPLETIONS,
                                self.body(self.prompt(ids), max_tokens), rec, self.t0)
        return rec

    def timing(self, rec: RequestRecord, probe: str) -> Timing:
        """The record as a Timing; a failed request ends the run (TargetError)."""
        if rec.error is not None:
            if rec.status in (401, 403):
                raise TargetError(f"{self.base}{COMPLETIONS} answered HTTP {rec.status}: the "
                                  "server wants an API key; pass it with --api-key")
            raise TargetError(f"a {probe} probe request to {self.base}{COMPLETIONS} failed: "
                              f"{rec.error}")
        return Timing(rec.prompt_tokens or rec.prompt_len, rec.max_tokens, rec.send_s or 0.0,
                      tuple(rec.chunk_times_s), rec.end_s or 0.0, rec.output_tokens,
                      rec.prompt_tokens, rec.cached_tokens)

    async def one(self, n: int, max_tokens: int, probe: str) -> Timing:
        return self.timing(await self.start(self.prompt_ids(n), max_tokens), probe)

    async def many(self, n: int, max_tokens: int, k: int, probe: str) -> list[Timing]:
        recs = await asyncio.gather(*(self.start(self.prompt_ids(n), max_tokens)
                                      for _ in range(k)))
        return [self.timing(r, probe) for r in recs]

    async def scrape(self) -> Scrape | None:
        if not self.has_metrics:
            return None
        return figures(await scrape(self.client, self.base, self.t0), self.now())

    async def settled(self) -> Scrape | None:
        """A scrape once the engine is idle and its step counter has stopped moving (the
        counters are fed when a step's records are, which may trail its tokens)."""
        last = await self.scrape()
        for _ in range(SETTLE_TRIES):
            if last is None:
                return None
            nxt = await self.scrape()
            if (nxt is not None and nxt.steps == last.steps and not nxt.running
                    and not nxt.waiting
                    and nxt.iteration_tokens_count == last.iteration_tokens_count):
                return nxt
            last = nxt
        return last

    async def alone(self, kind: str, n: int, max_tokens: int = 1, k: int = 1,
                    **shape: int) -> ProbeRun:
        """k requests of an n-token prompt at once, with settled scrapes around them."""
        before = await self.settled()
        reqs = await self.many(n, max_tokens, k, kind)
        run = ProbeRun(kind, n, k, max_tokens, requests=tuple(reqs), before=before,
                       after=await self.settled(), **shape)
        self.runs.append(run)
        return run

    # ---- the steps ----

    async def connect(self) -> None:
        """The model, the engine and its settings; the prompt form; whether output
        lengths can be held."""
        models = await read_models(self.client, self.base)
        chosen = next((m for m in models if m[0] == self.opts.model), None)
        if self.opts.model is not None and chosen is None:
            raise TargetError(f"--model {self.opts.model!r}: {self.base}/v1/models lists "
                              f"{', '.join(m[0] for m in models)}")
        model, root, max_len = chosen or models[0]
        snap = await scrape(self.client, self.base, self.t0)
        self.has_metrics = snap is not None
        self.target = TargetInfo(self.base, model, root, max_len, engine_kind(snap), "ids",
                                 snap.info("cache_info") if snap else None,
                                 snap.info() if snap else None)
        if snap is None:
            self.notes.append(f"{self.base}/metrics: none we can read; running, steps and "
                              "caching are inferred from client timings alone")
        if max_len is None:
            self.target = replace(self.target, max_model_len=2048)
            self.notes.append("/v1/models gives no max_model_len: prompts kept under 2048")
        await self.pick_prompt_form()
        await self.check_exact_lengths()

    async def pick_prompt_form(self) -> None:
        rec = await self.start(self.prompt_ids(4), 1)
        if rec.error is None:
            return
        if rec.status in (401, 403):
            self.timing(rec, "first")
        root = self.target.root
        if rec.status not in (400, 422) or not root or not Path(root, "tokenizer.json").is_file():
            raise TargetError(f"{self.base}{COMPLETIONS} refused a token-id prompt ({rec.error})"
                              " and /v1/models names no model folder with a tokenizer.json "
                              "to write text prompts with")
        from stepserve.model.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(root)
        self.target = replace(self.target, prompt_form="text")
        self.notes.append("the server takes no token-id prompts: text from the tokenizer at "
                          f"{root}; prompt lengths are the server's prompt_tokens")
        self.timing(await self.start(self.prompt_ids(4), 1), "first")

    async def check_exact_lengths(self) -> None:
        want = 8
        rec = await self.start(self.prompt_ids(4), want)
        if rec.error is not None and rec.status in (400, 422):
            self.exact = False
            self.notes.append(f"the server refused ignore_eos/min_tokens ({rec.error}); "
                              "output lengths are what the model chose")
            rec = await self.start(self.prompt_ids(4), want)
        got = self.timing(rec, "first").output_tokens
        if got is None:
            self.notes.append("the server reports no completion_tokens: output lengths are "
                              "counted as stream chunks")
        elif got != want:
            self.notes.append(f"the server did not hold the output length: completion_tokens "
                              f"{got} for max_tokens {want} with ignore_eos and min_tokens")

    async def floor(self) -> None:
        self.say("floor: one-token prompts")
        reqs = []
        stop = self.deadline("floor")
        while len(reqs) < 8 or (len(reqs) < 32 and self.now() < stop):
            self.check_budget("floor")
            reqs.append(await self.one(1, 1, "floor"))
        self.runs.append(ProbeRun("floor", 1, 1, 1, requests=tuple(reqs)))

    def lengths(self) -> list[int]:
        top = self.longest_prompt()
        out = [n for n in (16 * 2 ** i for i in range(16)) if n < top] + [top]
        return sorted(set(out))

    def longest_prompt(self, output: int = 1) -> int:
        return max(2, (self.target.max_model_len or 2048) - output)

    async def prompts(self) -> None:
        stop = self.deadline("prompt")
        lengths = self.lengths()
        for rep in range(3):
            for n in lengths:
                if rep and self.now() > stop:
                    break
                self.check_budget("prompt")
                self.say(f"prompt: {n} tokens alone")
                await self.alone("prompt", n)
        await self.budget_search(stop)
        budget = infer.token_budget(self.figures()).value
        n = min(budget or 128, 128, self.longest_prompt())
        for k in (2, 4, 8):
            if self.now() > stop and k > 2:
                break
            self.check_budget("prompt")
            self.say(f"burst: {k} x {n} tokens")
            await self.alone("burst", n, k=k)

    async def budget_search(self, stop: float) -> None:
        """The longest prompt-only request that takes one step, by bisection between the
        longest seen to take one and the shortest seen to take more (needs a step
        counter on /metrics)."""
        steps = infer.prompt_steps(self.figures())
        one = [n for n, s in steps.items() if s == 1]
        more = [n for n, s in steps.items() if s > 1]
        if not one or not more:
            return
        lo = max(one)
        above = [n for n in more if n > lo]
        if not above:
            return
        hi = min(above)
        while hi - lo > 1 and self.now() < stop:
            mid = (lo + hi) // 2
            self.say(f"prompt: step budget between {lo} and {hi}")
            run = await self.alone("prompt", mid)
            taken = run.delta("steps")
            if taken is None:
                return
            lo, hi = (mid, hi) if taken <= 1 else (lo, mid)

    async def decode(self) -> None:
        stop = self.deadline("decode")
        n_prompt = 16
        out = max(8, min(64, self.longest_prompt(n_prompt) - n_prompt))
        k, seen = 1, []
        while k <= MAX_LADDER:
            self.check_budget("decode")
            self.say(f"decode: {k} at once, {out} tokens each")
            run = await self.rung(k, n_prompt, out)
            seen.append(infer.running_peak(run))
            saturated = seen[-1] < k
            if (saturated and len(seen) >= 2 and seen[-1] <= seen[-2]) or self.now() > stop:
                break  # saturated and confirmed by one more rung, or out of time
            k *= 2

    async def rung(self, k: int, n_prompt: int, out: int) -> ProbeRun:
        before = await self.settled()
        during: list[Scrape] = []
        done = asyncio.Event()

        async def watch() -> None:
            while not done.is_set():
                s = await self.scrape()
                if s is None:
                    return
                during.append(s)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        try:
            reqs = await self.many(n_prompt, out, k, "decode")
        finally:
            done.set()
            await watcher
        run = ProbeRun("decode", n_prompt, k, out, requests=tuple(reqs), before=before,
                       after=await self.settled(), during=tuple(during))
        self.runs.append(run)
        return run

    async def mixed(self) -> None:
        """A long prompt into `batch` decodes, sent once each has a few tokens out."""
        figs = self.figures()
        seqs = infer.max_num_seqs(figs).value or 1
        batch = max(1, min(4, seqs - 1))
        budget = infer.token_budget(figs).value
        out = 48
        long_len = min(self.longest_prompt(), (budget or 4096) - batch, 1024)
        long_len = max(2, long_len)
        stop = self.deadline("mixed")
        for rep in range(4):
            if rep and self.now() > stop:
                break
            self.check_budget("mixed")
            self.say(f"mixed: a {long_len}-token prompt into {batch} decodes")
            before = await self.settled()
            recs = [RequestRecord(0, prompt_len=16, max_tokens=out) for _ in range(batch)]
            tasks = [asyncio.create_task(self.start_into(r, 16, out)) for r in recs]
            while (min(len(r.chunk_times_s) for r in recs) < 6
                   and not all(t.done() for t in tasks)):
                await asyncio.sleep(0.001)
            long = await self.start(self.prompt_ids(long_len), 1)
            await asyncio.gather(*tasks)
            reqs = [self.timing(r, "mixed") for r in (*recs, long)]
            self.runs.append(ProbeRun("mixed", 16, batch, out, long_len, tuple(reqs), before,
                                      await self.settled()))

    async def start_into(self, rec: RequestRecord, n: int, max_tokens: int) -> None:
        await stream_completion(self.client, self.base + COMPLETIONS,
                                self.body(self.prompt(self.prompt_ids(n)), max_tokens), rec,
                                self.t0)

    async def repeat(self) -> None:
        budget = infer.token_budget(self.figures()).value
        n = min(self.longest_prompt(), budget or 512, 512)
        stop = self.deadline("repeat")
        for rep in range(4):
            if rep >= 2 and self.now() > stop:
                break
            self.check_budget("repeat")
            self.say(f"repeat: a {n}-token prompt twice")
            ids = self.prompt_ids(n)
            before = await self.settled()
            first = self.timing(await self.start(ids, 1), "repeat")
            between = await self.settled()
            second = self.timing(await self.start(ids, 1), "repeat")
            self.runs.append(ProbeRun("repeat", n, 1, 1, requests=(first, second),
                                      before=before, after=await self.settled(),
                                      during=() if between is None else (between,)))

    def figures(self) -> ProbeFigures:
        return ProbeFigures(self.target, tuple(self.runs), self.opts.budget_s,
                            tuple(self.notes))


async def run_probes(opts: TargetOptions,
                     progress: Callable[[str], None] | None = None) -> ProbeFigures:
    """Every probe against opts.url, within opts.budget_s; TargetError (one line) when the
    server cannot be profiled or the budget runs out first."""
    opts = check_options(opts)
    headers = request_headers(opts.api_key, {})
    timeout = httpx.Timeout(min(60.0, opts.budget_s), connect=5.0)
    limits = httpx.Limits(max_connections=MAX_LADDER + 8, max_keepalive_connections=64)
    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
        prober = Prober(client, opts, progress)
        try:
            await prober.connect()
            await prober.floor()
            await prober.prompts()
            await prober.decode()
            await prober.mixed()
            await prober.repeat()
        except httpx.HTTPError as e:  # a scrape or a read the stream handling did not own
            raise TargetError(f"{opts.url}: {type(e).__name__}: {e}") from None
        return prober.figures()
