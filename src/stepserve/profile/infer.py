"""The settings a server does not print, inferred from the probes' figures
(probe_figures.py), each an `Inferred(value, evidence, confidence)`:

* `max_num_seqs`: where `running` stops rising as the decode ladder offers more. The peak
  of a rung is the larger of /metrics `running` during it and the most requests that had
  their first token and not yet their last at one moment (a request queued for a slot
  gets no token while the others decode). Saturated (peak below the offered count) on two
  rungs with the same peak: high; one rung, or from timings alone: medium; never
  saturated: at least the top rung, low.
* `token_budget` (max_num_batched_tokens): the longest prompt-only request the step
  counter shows taking one step, with one a token longer taking two (high; a gap left by
  the budget: medium); without a step counter, the prompt length past which TTFT jumps
  by a step's time (low). The iteration-token histogram's largest bucket is quoted as
  evidence.
* `chunked_prefill`: a prompt shorter than max_model_len took more than one step.
* `kv_capacity_tokens`: num_gpu_blocks x block_size from the cache info gauge (high);
  else the KV tokens a decode rung held (from its requests' timings) over `kv_usage` (low).
* `prefix_caching`: the repeated prompt's second send: prefix cache hits counted, tokens
  the engine computed (the iteration-token sum), usage's cached_tokens, and last TTFT.

Where an info gauge states a setting, it is quoted beside the inference, and a
disagreement said, but the value is what the probes saw.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stepserve.profile.probe_figures import ProbeFigures, ProbeRun
from stepserve.sim.calibrated import nnls
from stepserve.sim.target_settings import CONFIDENCE

T = TypeVar("T")


@dataclass(frozen=True)
class Inferred(Generic[T]):
    """A setting as inferred: its value (None: not found out), the evidence in words, how
    sure (high, medium, low), and whether the value is only a lower bound."""

    value: T | None
    evidence: tuple[str, ...]
    confidence: str = "low"
    at_least: bool = False

    def __post_init__(self) -> None:
        if self.confidence not in CONFIDENCE:
            raise ValueError(f"confidence {self.confidence!r}: not one of "
                             f"{', '.join(CONFIDENCE)}")

    def shown(self) -> str:
        value = "unknown" if self.value is None else (
            f">= {self.value}" if self.at_least else str(self.value))
        return f"{value} ({self.confidence}): {'; '.join(self.evidence)}"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "at_least": self.at_least,
                "confidence": self.confidence, "evidence": list(self.evidence)}


@dataclass(frozen=True)
class InferredSettings:
    max_num_seqs: Inferred[int]
    token_budget: Inferred[int]
    chunked_prefill: Inferred[bool]
    kv_capacity_tokens: Inferred[int]
    prefix_caching: Inferred[bool]

    def items(self) -> list[tuple[str, Inferred]]:
        return [(name, getattr(self, name)) for name in self.__dataclass_fields__]


def infer_settings(figs: ProbeFigures) -> InferredSettings:
    return InferredSettings(max_num_seqs(figs), token_budget(figs), chunked_prefill(figs),
                            kv_capacity_tokens(figs), prefix_caching(figs))


def _stated(figs: ProbeFigures, key: str, which: str = "scheduler") -> str | None:
    info = figs.target.scheduler_info if which == "scheduler" else figs.target.cache_info
    return None if not info else info.get(key)


def _quote(figs: ProbeFigures, key: str, value: object, which: str = "scheduler"
           ) -> list[str]:
    """The info gauge's word on `key`, and whether it agrees with `value`."""
    stated = _stated(figs, key, which)
    if stated is None:
        return []
    agrees = str(value).lower() == stated.lower()
    return [f"the server's {which} info says {key}={stated}"
            + ("" if agrees or value is None else f", which disagrees with the probes' {value}")]


# ---- running and max_num_seqs ----

def overlap_peak(run: ProbeRun) -> int:
    """The most requests of `run` between their first and last token at one moment."""
    events = sorted([(r.token_s[0], 1) for r in run.requests if r.token_s]
                    + [(r.token_s[-1], -1) for r in run.requests if r.token_s],
                    key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def gauge_peak(run: ProbeRun) -> int | None:
    seen = [s.running for s in run.during if s.running is not None]
    return int(max(seen)) if seen else None


def running_peak(run: ProbeRun) -> int:
    gauge = gauge_peak(run)
    return max(overlap_peak(run), gauge or 0)


def max_num_seqs(figs: ProbeFigures) -> Inferred[int]:
    rungs = sorted(figs.of("decode"), key=lambda r: r.batch)
    if not rungs:
        return Inferred(None, ("no decode ladder ran",))
    peaks = [(r.batch, running_peak(r), gauge_peak(r)) for r in rungs]
    ladder = ", ".join(f"{k} offered: {p} running" for k, p, _ in peaks)
    gauge = any(g is not None for _, _, g in peaks)
    how = "/metrics running and client timings" if gauge else "client timings"
    saturated = [(k, p) for k, p, _ in peaks if p < k]
    top = max(p for _, p, _ in peaks)
    stated = _quote(figs, "max_num_seqs", top if saturated else None)
    if not saturated:
        return Inferred(top, (f"the ladder never saturated ({ladder}; from {how})", *stated),
                        "low", at_least=True)
    confirmed = len(saturated) >= 2 and saturated[-1][1] == saturated[-2][1]
    confidence = "high" if confirmed and gauge else "medium"
    return Inferred(top, (f"running stopped rising at {top} ({ladder}; from {how})",
                          *stated), confidence)


# ---- the step token budget and chunked prefill ----

def prompt_steps(figs: ProbeFigures) -> dict[int, int]:
    """Steps a prompt-only request of each length took alone (the fewest seen: a step of
    other traffic can only add), from the step counter; {} without one."""
    out: dict[int, int] = {}
    for run in figs.of("prompt"):
        steps = run.delta("steps")
        if steps is not None and steps >= 1:
            out[run.prompt_len] = min(out.get(run.prompt_len, 1 << 30), int(steps))
    return out


def largest_iteration(figs: ProbeFigures) -> tuple[float, float] | None:
    """(lower, upper] of the largest iteration-token bucket any probe's steps landed in."""
    best: tuple[float, float] | None = None
    for run in figs.runs:
        if run.before is None or run.after is None:
            continue
        before = dict(run.before.iteration_buckets)
        prev_le, prev_inc = 0.0, 0.0
        for le, count in sorted(run.after.iteration_buckets):
            inc = count - before.get(le, 0.0)
            if inc > prev_inc and math.isfinite(le) and (best is None or le > best[1]):
                best = (prev_le, le)
            prev_le, prev_inc = le, max(inc, prev_inc)
    return best


def token_budget(figs: ProbeFigures) -> Inferred[int]:
    steps = prompt_steps(figs)
    hist = largest_iteration(figs)
    seen = [] if hist is None else [f"the largest step on the iteration-token histogram "
                                    f"was {hist[0]:g}..{hist[1]:g} tokens"]
    if steps:
        one = [n for n, s in steps.items() if s == 1]
        if not one:
            return Inferred(None, ("every prompt-only request took more than one step",
                                   *seen))
        lo = max(one)
        above = sorted((n, s) for n, s in steps.items() if n > lo)
        if not above:
            return Inferred(lo, (f"every prompt-only request up to {lo} tokens took one "
                                 "step", *seen, *_quote(figs, "max_num_batched_tokens", None)),
                            "low", at_least=True)
        hi, hi_steps = above[0]
        exact = hi == lo + 1
        evidence = (f"a {lo}-token prompt took one step, a {hi}-token one {hi_steps} "
                    "(the step counter)", *seen,
                    *_quote(figs, "max_num_batched_tokens", lo if exact else None))
        return Inferred(lo, evidence, "high" if exact else "medium", at_least=not exact)
    return _budget_from_ttft(figs, seen)


def _budget_from_ttft(figs: ProbeFigures, seen: list[str]) -> Inferred[int]:
    points = _median_ttft(figs)
    if len(points) < 4:
        return Inferred(None, ("too few prompt-only lengths to tell", *seen))
    jump = ttft_jump(figs)
    if jump is None:
        top = max(points)
        return Inferred(top, (f"TTFT rises smoothly up to {top} tokens: no second step seen",
                              *seen), "low", at_least=True)
    return Inferred(jump, (f"TTFT jumps past a {jump}-token prompt, as a second step "
                           "would (no step counter)", *seen), "low", at_least=True)


def ttft_jump(figs: ProbeFigures) -> int | None:
    """No step counter: the length B where TTFT = a + b n + c (ceil(n / B) - 1) fits the
    prompt-only medians far better than a + b n (c: a chunk's extra step); None where
    none does."""
    points = _median_ttft(figs)
    if len(points) < 4:
        return None
    ns = sorted(points)
    base = _sse([[1.0, n] for n in ns], [points[n] for n in ns])
    best = None
    for b in ns[:-2]:
        err = _sse([[1.0, n, math.ceil(n / b) - 1.0] for n in ns], [points[n] for n in ns])
        if best is None or err < best[1]:
            best = (b, err)
    return None if best is None or best[1] > 0.5 * base else best[0]


def _median_ttft(figs: ProbeFigures) -> dict[int, float]:
    by_len: dict[int, list[float]] = {}
    for run in figs.of("prompt"):
        for r in run.requests:
            if r.ttft_s is not None:
                by_len.setdefault(run.prompt_len, []).append(r.ttft_s)
    return {n: statistics.median(v) for n, v in by_len.items()}


def _sse(rows: list[list[float]], y: list[float]) -> float:
    x = nnls(rows, y)
    return sum((sum(a * b for a, b in zip(row, x)) - t) ** 2 for row, t in zip(rows, y))


def chunked_prefill(figs: ProbeFigures) -> Inferred[bool]:
    steps = prompt_steps(figs)
    split = sorted(n for n, s in steps.items() if s > 1)
    stated = _stated(figs, "enable_chunked_prefill")
    quoted = [f"the server's scheduler info says enable_chunked_prefill={stated}"] if stated \
        else []
    if split:
        return Inferred(True, (f"a {split[0]}-token prompt-only request took {steps[split[0]]}"
                               " steps", *quoted), "high")
    if not steps and (jump := ttft_jump(figs)) is not None:
        return Inferred(True, (f"TTFT jumps past a {jump}-token prompt, as a second step "
                               "would", *quoted), "low")
    if steps:
        return Inferred(None, (f"every prompt up to {max(steps)} tokens took one step: "
                               "whether longer ones would be split cannot be seen", *quoted))
    return Inferred(None, ("no step counter, and TTFT shows no second step", *quoted))


# ---- KV capacity ----

def kv_capacity_tokens(figs: ProbeFigures) -> Inferred[int]:
    info = figs.target.cache_info or {}
    try:
        blocks, size = int(info["num_gpu_blocks"]), int(info["block_size"])
    except (KeyError, ValueError):
        blocks = size = 0
    if blocks > 0 and size > 0:
        return Inferred(blocks * size, (f"the cache info gauge: num_gpu_blocks {blocks} x "
                                        f"block_size {size}",), "high")
    estimates = []
    for run in figs.of("decode"):
        for s in run.during:
            if not s.kv_usage or s.kv_usage < 1e-3:
                continue
            held = sum(r.prompt_len + sum(1 for t in r.token_s if t <= s.t_s)
                       for r in run.requests if r.token_s and r.token_s[0] <= s.t_s
                       <= r.token_s[-1])
            if held:
                estimates.append(held / s.kv_usage)
    if not estimates:
        return Inferred(None, ("no cache info gauge and no KV usage seen during a decode rung",))
    return Inferred(int(statistics.median(estimates)),
                    (f"tokens held by decode rungs over kv_usage, median of {len(estimates)} "
                     "scrapes (block rounding makes it an underestimate)",), "low")


# ---- prefix caching ----

def prefix_caching(figs: ProbeFigures) -> Inferred[bool]:
    runs = [r for r in figs.of("repeat") if len(r.requests) == 2]
    stated = _stated(figs, "enable_prefix_caching", "cache")
    quoted = [f"the cache info gauge says enable_prefix_caching={stated}"] if stated else []
    if not runs:
        value = None if stated is None else stated.lower() == "true"
        return Inferred(value, ("no repeated-prompt probe ran", *quoted),
                        "medium" if value is not None else "low")
    hits = [_between(r, "prefix_cache_hits", second=True) for r in runs]
    computed = [(_between(r, "iteration_tokens_sum", second=False),
                 _between(r, "iteration_tokens_sum", second=True)) for r in runs]
    cached = [r.requests[1].cached_tokens for r in runs]
    ttft = [(r.requests[0].ttft_s, r.requests[1].ttft_s) for r in runs]
    if all(h is not None for h in hits):
        on = statistics.median(hits) > 0  # type: ignore[type-var]
        return Inferred(on, (f"prefix cache hits counted on the second send: "
                             f"{', '.join(f'{h:g}' for h in hits)} tokens", *quoted), "high")
    if all(a is not None and b is not None for a, b in computed):
        less = [b < 0.9 * a for a, b in computed]  # type: ignore[operator]
        on = sum(less) > len(less) / 2
        shown = ", ".join(f"{a:g} then {b:g}" for a, b in computed)
        return Inferred(on, (f"tokens the engine computed for the first and second send: "
                             f"{shown}", *quoted), "high")
    if all(c is not None for c in cached):
        on = statistics.median(cached) > 0  # type: ignore[type-var]
        return Inferred(on, (f"usage's cached_tokens on the second send: {cached}", *quoted),
                        "medium")
    ratios = [b / a for a, b in ttft if a and b]
    if not ratios:
        return Inferred(None, ("the repeated prompts got no tokens", *quoted))
    ratio = statistics.median(ratios)
    return Inferred(ratio < 0.8, (f"the second send's TTFT was {ratio:.2f} of the first's "
                                  "(median)", *quoted), "low")


def _between(run: ProbeRun, name: str, second: bool) -> float | None:
    """A counter's increase over the first send (before..during[0]) or the second
    (during[0]..after)."""
    if not run.during:
        return None
    a, b = (run.during[0], run.after) if second else (run.before, run.during[0])
    x = None if a is None else getattr(a, name)
    y = None if b is None else getattr(b, name)
    return None if x is None or y is None or y < x else y - x
