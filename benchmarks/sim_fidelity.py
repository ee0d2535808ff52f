"""Does the calibrated simulator predict the real engine? The same requests run on the
real engine (in this process, on the wall clock, the bench's `--engine` path) and in the
simulator with a cost file from `stepserve profile` (the bench's `--sim` path), with the
same config and the same number of KV blocks; both are measured by the same bench code.

Workloads (the issue's a-e), on the default model unless --model:
  a  chat: Poisson arrivals at a moderate rate, prompts 64-256, outputs 16-96
  b  night-report: closed loop, every slot refilled; 15% long outputs, the rest short
  c  mixed prompts with chunked prefill and a per-request chunk cap (32 vs 1,200 tokens)
  d  a small KV cache that forces preemption, once with recompute and once with swap
  e  priority classes under the priority policy, Poisson
For each: throughput, TTFT P50/P99, TPOT P50/P99, E2E P99, preemptions; measured,
predicted and the error. Goal: throughput within 5% and every P99 within 10%.

    stepserve profile --out cost.json            # on the same quiet machine, first
    python benchmarks/sim_fidelity.py --cost cost.json [--only a,b] [--scale 0.5] \
        [--json OUT]

Measure on a quiet machine: the real side is wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass

from stepserve.bench.inprocess import run_engine, run_sim
from stepserve.bench.loadgen import LoadPlan
from stepserve.bench.results import summarize_records
from stepserve.config.settings import EngineConfig
from stepserve.metrics.run_summary import RunSummary
from stepserve.sim.cost_options import cost_file_warnings, load_cost_file
from stepserve.workload.spec import RequestSpec

METRICS = [("throughput tok/s", "throughput_tokens_per_s", 1.0, 0.05),
           ("TTFT P50", "ttft_p50_s", 1e3, None), ("TTFT P99", "ttft_p99_s", 1e3, 0.10),
           ("TPOT P50", "tpot_p50_s", 1e3, None), ("TPOT P99", "tpot_p99_s", 1e3, 0.10),
           ("E2E P99", "e2e_p99_s", 1e3, 0.10), ("preemptions", "preemptions", 1.0, None)]


@dataclass(frozen=True)
class Case:
    key: str
    name: str
    config: EngineConfig
    specs: list[RequestSpec]
    concurrency: int | None = None  # closed loop
    num_gpu_blocks: int | None = None  # None: the engine's default pool


def _spec(i: int, t: float, prompt: int, output: int, **kw) -> RequestSpec:
    return RequestSpec(i, t, prompt, output, output, **kw)


def _poisson(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def cases(scale: float) -> list[Case]:
    rng = random.Random(7)
    n = lambda k: max(8, round(k * scale))  # noqa: E731
    base = EngineConfig().replace(max_model_len=2048, max_num_seqs=32,
                                  max_num_batched_tokens=512)
    chat = [_spec(i, t, rng.randint(64, 256), rng.randint(16, 96))
            for i, t in enumerate(_poisson(rng, n(48), 0.6))]
    long = [rng.random() < 0.15 for _ in range(n(128))]
    night = [_spec(i, 0.0, rng.randint(16, 32), 96 if is_long else 4,
                   request_class="long" if is_long else "short")
             for i, is_long in enumerate(long)]
    mixed = [_spec(i, 0.0, 1200 if rng.random() < 0.25 else 32, rng.randint(16, 48))
             for i in range(n(40))]
    tight = [_spec(i, 0.0, rng.randint(96, 192), rng.randint(48, 96)) for i in range(n(40))]
    prio = [_spec(i, t, rng.randint(64, 192), rng.randint(16, 64), priority=p,
                  request_class=f"priority {p}")
            for i, (t, p) in enumerate(zip(_poisson(rng, n(48), 0.8),
                                           (rng.choice((0, 0, 1)) for _ in range(n(48)))))]
    small_kv = base.replace(max_model_len=320)  # 20 blocks a sequence at most, 48 in all
    return [
        Case("a", "chat, Poisson 0.6 req/s", base, chat),
        Case("b", "night-report, closed loop 64", base.replace(max_num_seqs=64), night, 64),
        Case("c", "mixed prompts, chunk cap 128", base.replace(long_prefill_token_threshold=128,
                                                               max_num_partial_prefills=1),
             mixed, 8),
        Case("d1", "small KV, recompute", small_kv.replace(preemption_mode="recompute"),
             tight, 16, num_gpu_blocks=48),
        Case("d2", "small KV, swap", small_kv.replace(preemption_mode="swap",
                                                      num_cpu_blocks=64),
             tight, 16, num_gpu_blocks=48),
        Case("e", "priority classes", base.replace(policy="priority"), prio),
    ]


def measure_real(case: Case, model: str) -> tuple[RunSummary, int]:
    from stepserve.engine.llm_engine import LLMEngine

    config = case.config
    if case.num_gpu_blocks is not None:
        config = config.replace(num_gpu_blocks=case.num_gpu_blocks)
    engine = LLMEngine(model, config)
    plan = LoadPlan(case.specs, case.concurrency)
    records, extra, _ = run_engine(plan, engine)
    engine.scheduler.kv.check_integrity()
    return summarize_records(records).updated(extra), engine.scheduler.kv.num_gpu_blocks


def predict(case: Case, cost, blocks: int) -> RunSummary:
    config = case.config.replace(num_gpu_blocks=blocks)
    records, extra, _ = run_sim(LoadPlan(case.specs, case.concurrency), config, cost, blocks)
    return summarize_records(records).updated(extra)


def compare(real: RunSummary, sim: RunSummary) -> list[dict]:
    rows = []
    for label, name, unit, goal in METRICS:
        m, p = getattr(real, name), getattr(sim, name)
        err = None if not m or p is None else (p - m) / m
        rows.append({"metric": name, "label": label, "measured": m, "predicted": p,
                     "error": err, "goal": goal,
                     "met": None if goal is None or err is None else abs(err) <= goal,
                     "unit": unit})
    return rows


def _num(v: float | None, unit: float) -> str:
    return "-" if v is None else f"{v * unit:,.1f}"


def table(key: str, name: str, rows: list[dict]) -> str:
    lines = [f"({key}) {name}", f"  {'':18}{'measured':>12}{'predicted':>12}{'error':>9}"]
    for r in rows:
        m, p = (_num(r[k], r["unit"]) for k in ("measured", "predicted"))
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        mark = "" if r["met"] is None else ("  ok" if r["met"] else "  MISS")
        lines.append(f"  {r['label']:18}{m:>12}{p:>12}{err:>9}{mark}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", required=True, help="a cost file from `stepserve profile`")
    ap.add_argument("--model", default="default")
    ap.add_argument("--only", help="cases to run, e.g. a,b,d1")
    ap.add_argument("--scale", type=float, default=1.0, help="request counts times this")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    cost = load_cost_file(args.cost)
    for warning in cost_file_warnings(cost, args.model):
        print(f"warning: {warning}", file=sys.stderr)
    wanted = set(args.only.split(",")) if args.only else None
    out = {"cost": args.cost, "cost_model": cost.describe(), "model": args.model,
           "scale": args.scale, "workloads": []}
    for case in cases(args.scale):
        if wanted and case.key not in wanted:
            continue
        t0 = time.perf_counter()
        real, blocks = measure_real(case, args.model)
        wall = time.perf_counter() - t0
        rows = compare(real, predict(case, cost, blocks))
        print(table(case.key, f"{case.name}: {len(case.specs)} requests, {blocks} KV blocks, "
                              f"real run {wall:.0f} s", rows), flush=True)
        out["workloads"].append({
            "name": f"{case.key}: {case.name}", "requests": len(case.specs),
            "num_gpu_blocks": blocks, "real_wall_s": wall,
            "measured": {r["metric"]: r["measured"] for r in rows},
            "predicted": {r["metric"]: r["predicted"] for r in rows},
            "error_pct": {r["metric"]: None if r["error"] is None else 100 * r["error"]
                          for r in rows},
            "goal_pct": {r["metric"]: 100 * r["goal"] for r in rows if r["goal"]},
            "missed": [r["metric"] for r in rows if r["met"] is False]})
    missed = [f"{w['name'].split(':')[0]}:{m}" for w in out["workloads"] for m in w["missed"]]
    print(f"\ngoals missed: {', '.join(missed) or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
