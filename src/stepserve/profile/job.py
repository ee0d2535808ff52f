"""`stepserve profile`: the real engine's step times over a grid of the batches the scheduler
produces (decodes by batch and context, prefill chunks, mixed steps, swaps; `measure_step`
times one on throwaway blocks of the runner's KV store), fitted to the calibrated cost
model, plus the engine's own per-step work around the runner. Every fourth point is held
out to measure the fit error.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.sim.calibrated import TERMS, CalibratedCost, fit, relative_errors, step_terms
from stepserve.sim.cost import computed_tokens, joining
from stepserve.sim.cost_options import this_host

if TYPE_CHECKING:
    from stepserve.model.runner import TorchRunner


@dataclass(frozen=True)
class StepTiming:
    median_s: float
    min_s: float
    times_s: tuple[float, ...]  # every timed repeat


def synthetic_step(decodes: int, context: int, chunk: int = 0,
                   chunk_start: int = 0) -> SchedulerOutput:
    """A step of `decodes` throwaway requests each decoding its `context`-th token (the
    last one held as an output token, which makes `Request.is_decoding` true), plus one
    prefill chunk of `chunk` tokens after `chunk_start` computed ones; no block tables."""
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    reqs = []
    for i in range(decodes):
        ids = [(7 * i + j) % 500 + 3 for j in range(context)]
        req = Request(f"profile-d{i}", ids[:-1], params, 0.0)
        req.output_token_ids.append(ids[-1])
        req.num_computed_tokens = context - 1
        reqs.append(req)
    if chunk:
        req = Request("profile-p0", [j % 500 + 3 for j in range(chunk_start + chunk)], params,
                      0.0)
        req.num_computed_tokens = chunk_start
        reqs.append(req)
    return SchedulerOutput(0, reqs, [1] * decodes + [chunk] * (1 if chunk else 0))


def measure_step(runner: TorchRunner, batch_size: int, context_len: int,
                 prefill_tokens: int = 0, repeats: int = 10, warmup: int = 2,
                 prefill_start: int = 0) -> StepTiming:
    """Time one step of `batch_size` decodes at `context_len` (plus an optional prefill
    chunk of `prefill_tokens` after `prefill_start` cached ones). Every repeat re-runs
    the same positions, so the shape stays fixed."""
    mgr = KVCacheManager(runner.num_gpu_blocks, runner.block_size)
    step = synthetic_step(batch_size, context_len, prefill_tokens, prefill_start)
    for r in step.requests:
        if not mgr.allocate_slots(r, r.num_tokens - r.num_computed_tokens):
            raise ValueError(f"KV cache too small for {len(step.requests)} x {r.num_tokens} "
                             "tokens")
    tables = [mgr.block_table(r.request_id) for r in step.requests]
    times = []
    for i in range(warmup + repeats):
        out = runner.execute(SchedulerOutput(i, step.requests, step.num_scheduled_tokens,
                                             block_tables=tables))
        if i >= warmup:
            times.append(out.elapsed_s)
    return StepTiming(statistics.median(times), min(times), tuple(times))


@dataclass(frozen=True)
class ProfileOptions:
    model: str = "default"
    dtype: str = "float32"
    quick: bool = False  # a small grid (CI, a first look)
    repeats: int = 5
    warmup: int = 2
    block_size: int = 16
    knee_tokens: int = 64
    swap: bool = True  # measure KV block copies to and from a CPU pool
    device: str = "cpu"


@dataclass(frozen=True)
class GridPoint:
    decodes: int = 0  # decode sequences
    context: int = 0  # their KV length after this step
    chunk: int = 0  # one prefill chunk's tokens (0: none)
    chunk_start: int = 0  # tokens of that sequence already cached
    swap_blocks: int = 0  # a block copy out and back in, instead of a step

    def label(self) -> str:
        if self.swap_blocks:
            return f"swap {self.swap_blocks} blocks"
        parts = [f"{self.decodes} decodes @ {self.context}"] if self.decodes else []
        if self.chunk:
            parts.append(f"chunk {self.chunk} after {self.chunk_start}")
        return " + ".join(parts)


def grid(quick: bool, max_len: int) -> list[GridPoint]:
    batches = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64)
    contexts = [c for c in ((16, 128) if quick else (16, 128, 512, 1024)) if c <= max_len]
    chunks = [c for c in ((16, 128) if quick else (16, 64, 128, 256, 512, 1024))
              if c <= max_len]
    points = [GridPoint(b, c) for b in batches for c in contexts]
    points += [GridPoint(chunk=n) for n in chunks]
    starts = (max_len // 2,) if quick else sorted({max_len // 4, max_len // 2})
    points += [GridPoint(chunk=n, chunk_start=s) for s in starts for n in chunks
               if s + n <= max_len]
    # a chunk riding with decodes: the steps chunked prefill makes, a CPU's small chunks
    # (64-256 tokens, host/step_budget.py) beside decodes at a short and a long context
    mixed = chunks[-2:] if quick else [n for n in (64, 128, 256, 1024) if n <= max_len]
    contexts_mixed = (128,) if quick else (128, 1024)
    points += [GridPoint(d, c, n) for d in ((4,) if quick else (4, 16, 32))
               for c in contexts_mixed for n in mixed if c <= max_len]
    points += [GridPoint(swap_blocks=k) for k in ((8,) if quick else (8, 64))]
    return points


@dataclass
class ProfileResult:
    cost: CalibratedCost  # its meta holds every grid point's timings
    held_out_error: dict[str, float] = field(default_factory=dict)  # median, p90, max
    overhead: dict[str, float] = field(default_factory=dict)  # per step, per sequence (s)


def point_terms(p: GridPoint, knee_tokens: int) -> tuple[float, ...]:
    if p.swap_blocks:
        return tuple(float(p.swap_blocks) if t == "swap" else 0.0 for t in TERMS)
    return step_terms(synthetic_step(p.decodes, p.context, p.chunk, p.chunk_start), knee_tokens)


def _time_point(runner, p: GridPoint) -> float:
    if not p.swap_blocks:
        return measure_step(runner, p.decodes, p.context or 1, p.chunk, repeats=1, warmup=0,
                            prefill_start=p.chunk_start).median_s
    pairs = [(b, b) for b in range(p.swap_blocks)]
    t0 = time.perf_counter()
    runner.kv.copy_blocks_to_cpu(pairs)
    runner.kv.copy_blocks_from_cpu(pairs)
    return (time.perf_counter() - t0) / 2  # the blocks copied one way


def _time_grid(runner, points: list[GridPoint], opts: ProfileOptions,
               progress: Callable[[str], None] | None) -> list[list[float]]:
    """Every point timed `repeats` times, in rounds over the whole grid (a burst of noise
    from elsewhere on the machine then lands on one repeat of many points, not on every
    repeat of one), after `warmup` untimed rounds."""
    times: list[list[float]] = [[] for _ in points]
    for r in range(opts.warmup + opts.repeats):
        for i, p in enumerate(points):
            if progress is not None:
                progress(f"round {r + 1}/{opts.warmup + opts.repeats}: {p.label()}")
            t = _time_point(runner, p)
            if r >= opts.warmup:
                times[i].append(t)
    return times


def _engine_overhead(runner, opts: ProfileOptions) -> dict[str, float]:
    """Seconds the engine spends around runner.execute per "step", "seq" and "join": a
    small closed-loop run's step wall time less the runner's, fitted on the step's
    sequences and the requests joining its batch."""
    from stepserve.config.settings import EngineConfig
    from stepserve.engine.llm_engine import LLMEngine, run_closed_loop

    engine = LLMEngine(config=EngineConfig().replace(max_model_len=256), runner=runner)
    spent: list[float] = []
    joins: list[int] = []
    execute = runner.execute

    def timed(out):
        joins.append(joining(computed_tokens(out)))
        t0 = time.perf_counter()
        try:
            return execute(out)
        finally:
            spent.append(time.perf_counter() - t0)

    runner.execute = timed
    walls, seqs = [], []
    step = engine.step

    def timed_step():
        t0 = time.perf_counter()
        result = step()
        if result.ran:
            walls.append(time.perf_counter() - t0)
            seqs.append(result.record.num_scheduled_seqs)
        return result

    engine.step = timed_step  # type: ignore[method-assign]
    try:
        jobs = [([(7 * i + j) % 300 + 3 for j in range(24)],
                 SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
                for i in range(12 if opts.quick else 48)]
        run_closed_loop(engine, jobs, 4 if opts.quick else 16)
    finally:
        runner.execute = execute
    extra = [w - s for w, s in zip(walls, spent, strict=True)]
    coef = fit([(1.0, float(n), 0, 0, 0, 0, 0, float(j), 0) for n, j in zip(seqs, joins,
                                                                         strict=True)],
               [max(e, 1e-6) for e in extra])
    return {term: coef.get(term, 0.0) for term in ("step", "seq", "join")}


def _blocks_needed(points: list[GridPoint], block_size: int) -> int:
    """KV blocks for the largest grid point (and the swap copies), plus a margin."""
    def blocks(n: int) -> int:
        return -(-n // block_size)
    return 16 + max(p.decodes * blocks(p.context) + blocks(p.chunk_start + p.chunk)
                    + p.swap_blocks for p in points)


def machine(device: str) -> dict[str, Any]:
    """What the cost was measured on (`host` is what a simulation compares)."""
    import torch

    host = this_host()
    hardware = f"CPU: {host}"
    if device.startswith("cuda"):
        hardware = f"CUDA: {torch.cuda.get_device_name(torch.device(device))} (host {host})"
    return {"host": host, "hardware": hardware, "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def profile(opts: ProfileOptions,
            progress: Callable[[str], None] | None = None) -> ProfileResult:
    from stepserve.model.kv_store import default_kv_budget
    from stepserve.model.model_args import load_model_args
    from stepserve.model.presets import resolve_model
    from stepserve.model.runner import TorchRunner

    args = load_model_args(resolve_model(opts.model))
    max_len = min(2048, args.max_position_embeddings or 2048)
    points = grid(opts.quick, max_len)
    runner = TorchRunner(opts.model, block_size=opts.block_size,
                         num_gpu_blocks=_blocks_needed(points, opts.block_size),
                         num_cpu_blocks=64 if opts.swap else 0, dtype=opts.dtype,
                         device=opts.device)
    points = [p for p in points if opts.swap or not p.swap_blocks]
    rows, medians, records = [], [], []
    for p, times in zip(points, _time_grid(runner, points, opts, progress), strict=True):
        rows.append(point_terms(p, opts.knee_tokens))
        medians.append(statistics.median(times))
        records.append({"point": p.label(), **vars(p), "median_s": medians[-1],
                        "min_s": min(times), "max_s": max(times)})
    overhead = _engine_overhead(runner, opts)
    held = [i for i in range(len(rows)) if i % 4 == 3]
    train = [i for i in range(len(rows)) if i % 4 != 3]
    partial = CalibratedCost(fit([rows[i] for i in train], [medians[i] for i in train]),
                             opts.knee_tokens)
    errors = sorted(relative_errors(partial, [rows[i] for i in held],
                                    [medians[i] for i in held]))
    coefficients = fit(rows, medians)
    for term, seconds in overhead.items():
        if term != "join" or seconds > 0:
            coefficients[term] = coefficients.get(term, 0.0) + seconds
    held_out = {"median": statistics.median(errors), "p90": errors[int(0.9 * (len(errors) - 1))],
                "max": errors[-1], "points": len(errors)}
    meta = {**machine(opts.device), "model": opts.model, "model_path": str(runner.model_path),
            "dtype": opts.dtype, "date": datetime.date.today().isoformat(),
            # the KV pool the engine gets by default here, for simulations that size it
            "kv_cache_bytes": default_kv_budget(opts.device).num_bytes,
            "kv_bytes_per_token": runner.args.kv_bytes_per_token,
            "block_size": opts.block_size, "grid": records, "fit_error": held_out,
            "engine_overhead": {f"{term}_s": s for term, s in overhead.items()}}
    return ProfileResult(CalibratedCost(coefficients, opts.knee_tokens, meta), held_out,
                         overhead)


def report(result: ProfileResult) -> str:
    """The coefficients, the engine's own share and the held-out fit error, as text."""
    e, cost = result.held_out_error, result.cost
    lines = [f"step cost model ({cost.describe()}), t = sum of:", *cost.explain(),
             f"  of which the engine around the model: {result.overhead['step'] * 1e3:.3g} "
             f"ms per step, {result.overhead['seq'] * 1e6:.3g} us per sequence, "
             f"{result.overhead.get('join', 0.0) * 1e6:.3g} us per request joining the batch",
             f"fit error on {e['points']} held-out grid points: median {e['median']:.1%}, "
             f"p90 {e['p90']:.1%}, max {e['max']:.1%}"]
    return "\n".join(lines)
