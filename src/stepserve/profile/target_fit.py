"""The step-time model of a server seen only over HTTP, and its spread, fitted from the
probes' figures to the calibrated cost model's terms (sim/calibrated.py: TERMS, `fit`).

Over HTTP one sees requests, not steps, so each probe is turned into step times whose
batches are known, and each row of the fit is the term counts (`step_terms` of a
`synthetic_step`) of the steps a measured time spans:

* the HTTP path: a one-token prompt's TTFT is the path's round trip plus one tiny step;
  that step is taken to cost what a lone decode step does (the decode ladder's median
  gap at one request), and `http_overhead_s` is the floor's median TTFT less it. Every
  TTFT below has it taken off.
* `step`, `seq`, `kv_read` (and `token` for decodes): a decode rung's inter-token gaps,
  inside the window where all its requests were decoding, are steps of exactly that many
  decodes at a known context; rungs at several batch sizes separate the fixed step cost
  from the per-sequence one.
* `token`, `token_hi`, `attn`, `chunk`, `join`: a prompt-only request alone is a run of
  prefill steps (one chunk of at most the token budget each, one after another: the
  budget from infer.py), so its TTFT less the HTTP path is their sum; lengths from 16 to
  max_model_len separate the per-token cost (linear) from attention (quadratic) and,
  past the budget, from the per-chunk cost. A burst of k packs its prompts into steps of
  at most the budget, whole prompts first, the last one chunked.
* the mixed step: the decodes' gap that ends with the long prompt's first token is one
  step of those decodes plus that prompt (a chunk of it, where it is longer than the
  budget left): it checks that decode and prefill costs add.
* the cached prefix: the repeated prompt's second TTFT is one chunk of the tokens not
  cached after those cached, which identifies attention over a cached prefix.

Every fourth row is held out to measure the fit's error, as `stepserve profile` does.

The spread is kept as data, not a constant: the decode gaps' ratios to their rung's
median (the step's own jitter, with the HTTP path's on top, as a client sees it) and
the floor's TTFTs' ratios to their median (the HTTP path's), each as quantiles and a
bounded sorted sample, so a simulator can draw from them to reproduce P99s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepserve.core.output import SchedulerOutput
from stepserve.profile.infer import InferredSettings, running_peak
from stepserve.profile.job import synthetic_step
from stepserve.profile.probe_figures import ProbeFigures, ProbeRun
from stepserve.sim.calibrated import CalibratedCost, fit, relative_errors, step_terms

KNEE_TOKENS = 64  # as `stepserve profile`'s default
MAX_SAMPLES = 2000  # of a spread kept in the file
QUANTILES = (0.5, 0.9, 0.99, 0.999)
MIN_SECONDS = 1e-6  # a time the fit may divide by


@dataclass(frozen=True)
class Distribution:
    """Values relative to their median (1.0 is typical): quantiles and a sorted sample."""

    median_s: float  # the median the ratios are of (pooled where several)
    quantiles: dict[str, float]
    samples: tuple[float, ...]
    count: int

    @classmethod
    def of(cls, ratios: Sequence[float], median_s: float) -> Distribution:
        vals = sorted(ratios)
        if not vals:
            return cls(median_s, {}, (), 0)
        stride = max(1, len(vals) // MAX_SAMPLES)
        qs = {f"p{q * 100:g}": vals[min(len(vals) - 1, int(q * len(vals)))] for q in QUANTILES}
        qs["max"] = vals[-1]
        return cls(median_s, qs, tuple(vals[::stride][:MAX_SAMPLES]), len(vals))


@dataclass(frozen=True)
class Spread:
    step_gap: Distribution  # decode gaps over their rung's median
    http_floor: Distribution  # one-token TTFTs over their median
    http_overhead_s: float  # the floor's TTFT less a lone decode step
    mixed_growth: float | None  # mixed-step gap over the plain decode gap (median)


@dataclass(frozen=True)
class TargetFit:
    cost: CalibratedCost
    spread: Spread
    held_out_error: dict[str, float]
    rows: int  # measured times the fit had


def steady_gaps(run: ProbeRun) -> list[float]:
    """The gaps of `run`'s requests while all of them were decoding."""
    reqs = [r for r in run.requests if len(r.token_s) > 2]
    if not reqs:
        return []
    start = max(r.token_s[0] for r in reqs)
    end = min(r.token_s[-1] for r in reqs)
    return [b - a for r in reqs for a, b in zip(r.token_s, r.token_s[1:])
            if a >= start and b <= end]


def _merge(steps: Sequence[SchedulerOutput]) -> SchedulerOutput:
    return SchedulerOutput(0, [r for s in steps for r in s.requests],
                           [n for s in steps for n in s.num_scheduled_tokens])


def _sum_rows(rows: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(map(sum, zip(*rows)))


def prefill_steps(prompts: Sequence[int], budget: int | None,
                  decodes: int = 0, context: int = 0) -> list[SchedulerOutput]:
    """The steps that prefill `prompts` (token counts, in order) under a token budget
    (None: unbounded), whole prompts first and the last one chunked, each step also
    carrying `decodes` decodes at `context`."""
    left = [[n, 0] for n in prompts]  # [tokens still to compute, computed]
    out = []
    while left:
        room = (budget or 1 << 30) - decodes
        if room <= 0:
            raise ValueError("the token budget leaves no room for a prefill")
        parts = [synthetic_step(decodes, context)] if decodes else []
        while left and room > 0:
            todo, done = left[0]
            take = min(todo, room)
            parts.append(synthetic_step(0, 0, take, done))
            room -= take
            if take == todo:
                left.pop(0)
            else:
                left[0] = [todo - take, done + take]
        out.append(_merge(parts))
    return out


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fit_target(figs: ProbeFigures, settings: InferredSettings) -> TargetFit:
    """The cost model and spread from the probes (see the module's docstring)."""
    budget = settings.token_budget.value
    if settings.token_budget.at_least:
        budget = None  # no prompt seen split: every prompt probed is one step
    rows: list[tuple[float, ...]] = []
    seconds: list[float] = []

    def add(steps: Sequence[SchedulerOutput], t: float | None) -> None:
        if t is not None:
            rows.append(_sum_rows([step_terms(s, KNEE_TOKENS) for s in steps]))
            seconds.append(max(t, MIN_SECONDS))

    # decode rungs (unsaturated: all of a rung's requests decode together)
    ratios: list[float] = []
    lone_gap = None
    for run in figs.of("decode"):
        gaps = steady_gaps(run)
        med = _median(gaps)
        if med is None or med <= 0:
            continue
        ratios += [g / med for g in gaps]
        if running_peak(run) < run.batch:
            continue
        if run.batch == 1:
            lone_gap = med
        add([synthetic_step(run.batch, run.prompt_len + run.output_len // 2)], med)
    floor = [r.ttft_s for run in figs.of("floor") for r in run.requests if r.ttft_s]
    floor_med = _median(floor) or 0.0
    overhead = max(0.0, floor_med - (lone_gap or 0.0))

    def ttft(t: float | None) -> float | None:
        return None if t is None else t - overhead

    by_len: dict[int, list[float]] = {}
    for run in figs.of("prompt"):
        by_len.setdefault(run.prompt_len, []).extend(
            r.ttft_s for r in run.requests if r.ttft_s is not None)
    for n, ts in sorted(by_len.items()):
        add(prefill_steps([n], budget), ttft(_median(ts)))
    for run in figs.of("burst"):
        ends = [r.token_s[0] for r in run.requests if r.token_s]
        if ends and len(ends) == len(run.requests):
            first_send = min(r.send_s for r in run.requests)
            add(prefill_steps([run.prompt_len] * run.batch, budget),
                ttft(max(ends) - first_send))
    growth = []
    for run in figs.of("mixed"):
        gap, base = _mixed_gap(run)
        if gap is not None:
            ctx = run.prompt_len + 6
            add(prefill_steps([run.long_len], budget, run.batch, ctx)[:1], gap)
            if base:
                growth.append(gap / base)
    block = int((figs.target.cache_info or {}).get("block_size", 16) or 16)
    caching = settings.prefix_caching.value
    for run in figs.of("repeat"):
        if len(run.requests) != 2:
            continue
        second = run.requests[1]
        n = run.prompt_len
        cached = second.cached_tokens
        if cached is None:
            cached = (n - 1) // block * block if caching else 0
        cached = min(max(0, cached), n - 1)
        t = ttft(second.ttft_s)
        if t is not None:
            rows.append(step_terms(synthetic_step(0, 0, n - cached, cached), KNEE_TOKENS))
            seconds.append(max(t, MIN_SECONDS))
    if not rows:
        raise ValueError("the probes measured no step times to fit")
    held = [i for i in range(len(rows)) if i % 4 == 3]
    train = [i for i in range(len(rows)) if i % 4 != 3]
    errors: dict[str, float] = {"points": float(len(held))}
    if held and train:
        partial = CalibratedCost(fit([rows[i] for i in train], [seconds[i] for i in train]),
                                 KNEE_TOKENS)
        errs = sorted(relative_errors(partial, [rows[i] for i in held],
                                      [seconds[i] for i in held]))
        errors.update(median=statistics.median(errs), p90=errs[int(0.9 * (len(errs) - 1))],
                      max=errs[-1])
    cost = CalibratedCost(fit(rows, seconds), KNEE_TOKENS)
    floor_ratios = [t / floor_med for t in floor] if floor_med else []
    spread = Spread(Distribution.of(ratios, _median([g for run in figs.of("decode")
                                                     for g in steady_gaps(run)]) or 0.0),
                    Distribution.of(floor_ratios, floor_med), overhead, _median(growth))
    return TargetFit(cost, spread, errors, len(rows))


def _mixed_gap(run: ProbeRun) -> tuple[float | None, float | None]:
    """The decodes' gap that ends with the long prompt's first token (median over the
    decodes), and their median gap otherwise."""
    *decodes, long = run.requests
    if not long.token_s:
        return None, None
    t_long = long.token_s[0]
    hit, rest = [], []
    for r in decodes:
        pairs = list(zip(r.token_s, r.token_s[1:]))
        if not pairs:
            continue
        j = min(range(len(pairs)), key=lambda i: abs(pairs[i][1] - t_long))
        hit.append(pairs[j][1] - pairs[j][0])
        rest += [b - a for i, (a, b) in enumerate(pairs) if abs(i - j) > 1 and i > 1]
    return _median(hit), _median(rest)


def spread_json(spread: Spread) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spread)
