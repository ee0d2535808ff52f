"""Decode runs, the simulator's fast path: a stretch of the continuous scheduler's
decode-only steps worked out at once.

When nothing waits or is swapped and every running request decodes, each step gives
every request one token; only the requests that take a block or end in a step change
anything else, so only those are touched per step and the rest are brought up to date
when the run ends. `run_decodes` leaves exactly what stepping would (tokens, times,
block ids in the same order, records, policy counters; tests/sim/test_decode_run.py
compares both ways); where the steps are not plain or a block would run out it does
nothing and schedule() steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, eq, sub

from stepserve.core.output import StepRecord
from stepserve.core.request import Request, RequestStatus, is_decoding
from stepserve.core.scheduler import Scheduler

_LENGTH, _STOPPED = RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_STOPPED
# attribute getters: map() over them runs at C speed (a run starts thousands of times)
_OUTPUT = attrgetter("output_token_ids")
_COMPUTED = attrgetter("num_computed_tokens")
_MAX_TOKENS = attrgetter("max_tokens")
_MIN_TOKENS = attrgetter("min_tokens")
_STOP_IDS = attrgetter("stop_ids")
_ID = attrgetter("request_id")


@dataclass(frozen=True)
class Sampler:
    """The runner's side of a decode run: request i samples `token` in the first
    `plain_steps(batch, held)[i]` steps (`held`: output tokens now), then `eos`."""

    token: int
    eos: int
    plain_steps: Callable[[list[Request], list[int]], list[int]]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Decode-only steps done at once: their records, the requests ended in them, the
    last step's end, and the ids ended before (for the runner to drop)."""

    records: list[StepRecord]
    finished: list[Request]
    end_s: float
    released_ids: list[str]
    # the last step ends at or after `until`: the caller sets its num_waiting then
    straddles: bool = False


def decoding_batch(sched: Scheduler) -> list[Request] | None:
    """The running requests when the next step is plain (continuous batching, nothing
    swapped, all decoding within the budget, nothing waiting that could be admitted or
    time out); else None."""
    if type(sched) is not Scheduler:
        return None
    running = sched.running
    if sched.swapped or not running or len(running) > sched.sc.max_num_batched_tokens:
        return None
    if sched.waiting and (len(running) < sched.sc.max_num_seqs
                          or sched.qc.max_queue_time_s):
        return None
    if not all(map(is_decoding, running)):
        return None
    return running


def _end_steps(batch: list[Request], held: list[int], plain: list[int], sampler: Sampler
               ) -> tuple[list[int], list[bool]]:
    """The step each request ends in, and whether by length (update_from_output's
    rules)."""
    token, eos = sampler.token, sampler.eos
    at_length = list(map(sub, map(_MAX_TOKENS, batch), held))
    first_eos = [p + 1 for p in plain]
    if not any(map(_MIN_TOKENS, batch)) and \
            all(map(eq, map(_STOP_IDS, batch), repeat(frozenset((eos,))))):
        final = list(map(min, at_length, first_eos))  # the usual case: EOS ends it
    else:
        final = []
        for req, end, first, had in zip(batch, at_length, first_eos, held):
            stops = req.stop_ids
            may_stop = max(1, req.min_tokens - had)  # the first step with min_tokens out
            if token in stops and may_stop < first:
                end = min(end, may_stop)
            if eos in stops:
                end = min(end, max(may_stop, first))
            final.append(end)
    return final, list(map(int.__eq__, final, at_length))


def run_decodes(sched: Scheduler, start: float, until: float,
                step_time: Callable[[int, int], float], sampler: Sampler,
                stop_at_first_end: bool = False, straddle: bool = False) -> DecodeRun | None:
    """Apply from `start` the decode-only steps completing before `until` (the next
    outside event), with `straddle` also one completing after it if nobody ends in it and
    no tokens are counted; `stop_at_first_end`: stop after a step a request ends in.
    `step_time(n, computed)`: n decodes holding `computed` tokens. None: no step."""
    batch = decoding_batch(sched)
    if batch is None:
        return None
    run = _Run(sched, batch, sampler)
    stop_at_first_end = stop_at_first_end or run.num_waiting > 0
    straddle = straddle and not sched.policy.tracks_tokens
    num_released = len(sched.freed_ids)  # ended before the run: the runner is told now
    t, straddles = start, False
    while run.n and t < until:
        duration = step_time(run.n, run.computed)
        end_s = t + duration
        straddling = not end_s < until
        if straddling and (not straddle or run.final[run.ending[run.e]] == run.step + 1):
            break
        if not run.take_blocks():
            break  # schedule() preempts for this step
        straddles = straddling
        active = run.n
        run.times.append(end_s)
        run.computed += active
        run.end_requests(end_s)
        run.record(end_s, duration, active)
        t = end_s
        if straddles or (stop_at_first_end and run.n < active):
            break
    if not run.step:
        return None
    run.catch_up_the_rest()
    released = sched.freed_ids[:num_released]
    del sched.freed_ids[:num_released]
    return DecodeRun(sched.take_step_records(), sched.take_finished(), t, released, straddles)


class _Run:
    """A decode run's state: when each request ends and takes blocks; steps so far."""

    def __init__(self, sched: Scheduler, batch: list[Request], sampler: Sampler) -> None:
        self.sched, self.batch, self.sampler = sched, batch, sampler
        kv = self.kv = sched.kv
        self.block_size, self.gpu = kv.block_size, kv.gpu
        held = list(map(len, map(_OUTPUT, batch)))
        plain = sampler.plain_steps(batch, held)
        if min(plain) < 0:
            plain = [p if p > 0 else 0 for p in plain]
        self.plain = plain
        self.final, self.by_length = _end_steps(batch, held, plain, sampler)
        done = list(map(_COMPUTED, batch))
        # a request takes a block after `room` more tokens, then every block_size steps
        self.room = list(map(sub, map(self.block_size.__mul__, map(len, map(
            kv.block_tables.__getitem__, map(_ID, batch)))), done))
        # positions by end and by first block taken (stable: batch order within a step)
        positions = range(len(batch))
        self.ending = sorted(positions, key=self.final.__getitem__)
        self.taking = sorted(positions, key=self.room.__getitem__)
        self.again: dict[int, list[int]] = {}  # step -> positions taking another block then
        self.n = len(batch)  # requests still running
        self.computed = sum(done)
        self.step0 = sched.step_index
        self.num_waiting = len(sched.waiting)
        self.times: list[float] = []  # each applied step's end
        self.step = self.e = self.k = 0  # steps applied; next in `ending`; next in `taking`

    def take_blocks(self) -> bool:
        """Give the next step's takers a block each and apply the step; False (nothing
        taken) without enough free blocks."""
        step, room, taking, final = self.step, self.room, self.taking, self.final
        k = self.k
        while k < len(taking) and room[taking[k]] == step:
            k += 1
        takers = [i for i in taking[self.k:k] if final[i] > step] + self.again.pop(step + 1, [])
        if len(takers) > self.gpu.num_free:
            return False
        self.step = step = step + 1
        self.k = k
        if takers:
            takers.sort()
            tables, batch, bs = self.kv.block_tables, self.batch, self.block_size
            for i in takers:
                tables[batch[i].request_id].extend(self.gpu.take(1))
                if step + bs <= final[i]:
                    self.again.setdefault(step + bs, []).append(i)
        return True

    def end_requests(self, end_s: float) -> None:
        """End the requests whose last step is the one just applied (at `end_s`)."""
        ending, final, step = self.ending, self.final, self.step
        while self.e < len(ending) and final[ending[self.e]] == step:
            i = ending[self.e]
            self.e += 1
            req = self.batch[i]
            _catch_up(self.sched, [req], [self.plain[i]], step, self.times, self.sampler,
                      self.step0)
            self.computed -= req.num_computed_tokens
            if self.by_length[i]:
                self.sched.end_request(req, _LENGTH, now=end_s)
            else:  # the token it sampled in its last step stopped it
                last = self.sampler.token if step <= self.plain[i] else self.sampler.eos
                self.sched.end_request(req, _STOPPED, now=end_s,
                                       stop_reason=None if last == req.stop_eos else last)
            self.n -= 1

    def record(self, end_s: float, duration: float, active: int) -> None:
        """The StepRecord stepping would have left."""
        waiting, sched = self.num_waiting, self.sched
        sched.step_records.append(StepRecord(
            index=self.step0 + self.step - 1, start_s=end_s - duration, duration_s=duration,
            num_prefill_tokens=0, num_decode_tokens=active, num_scheduled_seqs=active,
            num_decode_ready=active, num_running=self.n, num_waiting=waiting,
            num_swapped=0, num_preempted=0, kv_usage=self.kv.usage,
            slots_held=min(sched.sc.max_num_seqs, active + waiting), num_active=active))

    def catch_up_the_rest(self) -> None:
        """Bring the requests still running up to date and the step index on."""
        sched, step = self.sched, self.step
        batch, plain = self.batch, self.plain
        if self.n < len(batch):  # some ended in the run: only the others remain
            left = [i for i, final in enumerate(self.final) if final > step]
            # (`batch` is sched.running itself: the run ends requests without leaving it)
            batch, plain = list(map(batch.__getitem__, left)), list(map(plain.__getitem__, left))
            sched.running = batch
        _catch_up(sched, batch, plain, step, self.times, self.sampler, self.step0)
        sched.step_index += step
        # Filled blocks are named now: nobody looks the cache up during a run and naming
        # order does not matter (kv_cache.py); ended requests named theirs on release.
        if self.kv.enable_prefix_caching:
            # only requests with at most `step` free slots filled one: `taking` lists them first
            cache_blocks, room, final, everyone = self.kv.cache_blocks, self.room, \
                self.final, self.batch
            for i in self.taking:
                if room[i] > step:
                    break
                if final[i] > step:  # still running
                    cache_blocks(everyone[i], everyone[i].num_computed_tokens)


def _catch_up(sched: Scheduler, requests: list[Request], plain: list[int], steps: int,
              times: list[float], sampler: Sampler, step0: int) -> None:
    """Bring `requests` up to date after `steps` steps of the run, as stepping would
    (`times`: the run's step ends so far)."""
    tokens = [sampler.token] * steps
    token_times = times if steps == len(times) else times[:steps]
    last = step0 + steps - 1
    on_tokens = sched.policy.on_tokens if sched.policy.tracks_tokens else None
    for req, p in zip(requests, plain):
        req.num_computed_tokens += steps
        if p >= steps:
            req.output_token_ids += tokens
        else:  # it samples EOS within the run and goes on (ignore_eos, min_tokens)
            req.output_token_ids += tokens[:p] + [sampler.eos] * (steps - p)
        req.token_times += token_times
        req.sched_step = last
        req.sched_tokens = 1
        if on_tokens is not None:
            on_tokens(req, steps)
