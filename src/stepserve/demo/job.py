"""`stepserve demo`: the night-report incident's job (64 in flight, ~15% of requests 100x
longer, twice as many requests as slots), static vs continuous batching, on the default
model on a CPU and then at full-scale lengths (P50 20 / P99 2,000; 2,000 requests, within
a few percent of the workload's 6,400 speedup) in the simulator on an H100 profile; one
table and the speedups against their caps, within a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

from stepserve.config.errors import UsageError, report_error
from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import EngineConfig
from stepserve.config.user_files import OutputFile, check_output_file, write_outputs
from stepserve.core.request import SamplingParams
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.summary import summarize
from stepserve.plan.model_specs import get_model_spec
from stepserve.plan.speedup import speedup_for_lengths
from stepserve.sim.cost import CostModel
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.report import ROWS, Row, fmt_s, format_runs
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.sim.run import RunResult, run_config
from stepserve.sim.scenarios import num_gpu_blocks_for
from stepserve.workload.builtin import get_workload

TOPICS = ["the night shift", "quarterly sales", "the weather in Paris", "a delayed train",
          "server uptime", "a new coffee machine", "the warehouse inventory", "a team offsite",
          "customer feedback", "the marketing budget", "a software release", "a data backup"]


def demo_jobs(tokenizer, num_requests: int, short: int, long: int, seed: int = 0):
    """Prompts of real text; output lengths fixed per request (ignore_eos), ~10/64 long."""
    rng = random.Random(seed)
    jobs, lengths = [], []
    for i in range(num_requests):
        n = long if rng.random() < 10 / 64 else short
        topic = TOPICS[i % len(TOPICS)]
        prompt = f"Write entry {i} of tonight's report: a few lines about {topic}."
        jobs.append((tokenizer.encode(prompt),
                     SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))
        lengths.append(n)
    return jobs, lengths


@dataclass(frozen=True)
class DemoRun:
    """A column of the demo's table: a real-engine run (with its wall time) or a
    simulated one (its RunResult), and what ran it."""

    name: str
    batching: str
    summary: RunSummary
    describe: str
    wall_s: float | None = None
    sim: RunResult | None = None

    def to_json(self) -> dict[str, Any]:
        if self.sim is not None:
            return {**self.sim.to_json(), "describe": self.describe}
        return {"name": self.name, "batching": self.batching,
                "summary": self.summary.to_json(), "wall_s": self.wall_s,
                "describe": self.describe}


def run_real(runner, batching: str, jobs, concurrency: int) -> DemoRun:
    from stepserve.engine.llm_engine import LLMEngine, run_closed_loop

    # settings, not a full config: the step budget comes from the hardware
    settings = ConfigOverrides(settings={"batching": batching, "max_num_seqs": concurrency,
                                         "max_model_len": 2048})
    engine = LLMEngine(config=settings, runner=runner)
    t0 = time.perf_counter()
    res = run_closed_loop(engine, jobs, concurrency,
                          request_class=lambda i: "long" if jobs[i][1].max_tokens > 10
                          else "short")
    wall = time.perf_counter() - t0
    summary = summarize(res.requests, res.steps, res.duration_s)
    engine.core.check_integrity()
    return DemoRun(f"cpu-{batching}", batching, summary, engine.runner.describe(), wall)


def run_sim(batching: str, num_requests: int, cost_choice: str | None = None
            ) -> tuple[DemoRun, list[int]]:
    """The simulated run (SmolLM2 on an H100's roofline, or `cost_choice`: constant,
    roofline or a `stepserve profile` file), and its requests' output lengths (for the
    speedup cap)."""
    workload = get_workload("night-report", num_requests=num_requests)
    specs = workload.generate()
    config = EngineConfig().replace(batching=batching, max_num_seqs=64,
                                    max_num_batched_tokens=8192, max_model_len=4096)
    if cost_choice is None:
        spec = get_model_spec("smollm2-135m")
        cost: CostModel = RooflineCost(get_hardware("h100"), spec)
        blocks = num_gpu_blocks_for(config, cost.kv_cache_bytes(), spec.kv_bytes_per_token)
        name = f"h100-sim-{batching}"
    else:
        setup = cost_setup_for(CostModelOptions(cost_choice, model_spec="smollm2-135m"))
        cost, blocks = setup.cost_model, setup.num_gpu_blocks(config)
        name = f"sim-{batching}"
    run = run_config(name, config, specs, cost, blocks, 64)
    return (DemoRun(run.name, batching, run.summary, cost.describe(), sim=run),
            [s.output_len for s in specs])


def _tokens(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


DEMO_ROWS: list[Row] = [
    ("requests (output tokens)",
     lambda s: f"{s.requests_finished} ({_tokens(s.output_tokens, ',')})", ""),
    ("duration", lambda s: fmt_s(s.duration_s), "first request in to last token out"),
    ("throughput (useful tok/s)", lambda s: _tokens(s.throughput_tokens_per_s, ",.1f"), ""),
    *[row for row in ROWS if row[0] in ("slot utilisation", "TTFT P50 / P99",
                                        "TPOT P50 / P99")],
    ("preemptions", lambda s: str(s.preemptions), ""),
    ("mean step", lambda s: fmt_s(s.mean_step_s), "engine step, wall or simulated"),
]


@dataclass(frozen=True)
class DemoOptions:
    model: str = "default"  # model preset or HF directory
    requests: int = 128  # real-engine requests
    short: int = 1  # short output length (tokens)
    long: int = 100  # long output length (tokens)
    sim_requests: int = 2000  # simulated requests
    json_out: str | None = None  # also write the table as JSON
    cost: str | None = None  # the simulator's cost model (default: H100 roofline)


def _speedup(pair: list[DemoRun]) -> float:
    """Continuous over static throughput."""
    fast = pair[1].summary.throughput_tokens_per_s
    slow = pair[0].summary.throughput_tokens_per_s
    assert fast is not None and slow, "both runs produced tokens"
    return fast / slow


def run_demo(options: DemoOptions) -> int:
    check_output_file("--json", options.json_out)  # before minutes of work
    if options.cost is not None:  # a bad cost file is refused before the real runs
        cost_setup_for(CostModelOptions(options.cost, model_spec="smollm2-135m"))
    print("stepserve demo: the night-report incident's job (64 in flight, ~15% of requests "
          "100x longer than the rest), static vs continuous batching.")
    start = time.perf_counter()
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.model.presets import ALIASES, PRESETS

    preset = PRESETS.get(ALIASES.get(options.model, options.model))
    fresh = preset is not None and not preset.path().is_dir()  # not yet in the cache

    try:  # converted first where the cache lacks it
        engine = LLMEngine(options.model, ConfigOverrides(settings={"max_model_len": 2048}))
    except (ValueError, FileNotFoundError) as e:  # an unknown model name or directory
        raise UsageError(f"--model {options.model!r}: {e}") from None
    timing: dict[str, Any] = {"model": time.perf_counter() - start, "fresh_cache": fresh}
    print(f"model: {engine.runner.describe()}")
    print(f"  ready in {timing['model']:.0f} s"
          + (" (fresh cache: converted from the GGUF first)" if fresh else " (cached)"))
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}])
    req = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=24))
    text = engine.run_until_done()[req.request_id].full_text.strip()

    jobs, real_lengths = demo_jobs(engine.tokenizer, options.requests, options.short,
                                   options.long)
    print(f"real engine: {len(jobs)} requests, outputs {options.short} or {options.long} "
          f"tokens ({sum(n == options.long for n in real_lengths)} long), 64 in flight, "
          "CPU ...")
    real = [run_real(engine.runner, b, jobs, 64) for b in ("static", "continuous")]
    timing["real_engine"] = sum(r.wall_s or 0.0 for r in real)
    print(f"  done in {timing['real_engine']:.0f} s; simulator at full-scale lengths "
          f"({options.sim_requests} requests, P50 20 / P99 2000 tokens) on "
          f"{options.cost or 'H100'} ...")
    t0 = time.perf_counter()
    sims = [run_sim(b, options.sim_requests, options.cost) for b in ("static", "continuous")]
    timing["simulator"] = time.perf_counter() - t0
    sim = [run for run, _ in sims]

    cap_real = speedup_for_lengths(real_lengths, 64)
    c = {"cpu_speedup": _speedup(real), "cpu_speedup_cap": cap_real.speedup_cap,
         "cpu_static_slot_utilization": cap_real.slot_utilization,
         "sim_speedup": _speedup(sim),
         "sim_speedup_cap": speedup_for_lengths(sims[0][1], 64).speedup_cap}
    print(f"\n{format_runs(real + sim, DEMO_ROWS)}\n")
    print(f"continuous / static throughput: CPU measured {c['cpu_speedup']:.2f}x against a "
          f"step-count cap of {c['cpu_speedup_cap']:.2f}x (static slot utilisation "
          f"{c['cpu_static_slot_utilization'] * 100:.1f}%); "
          f"{'H100' if options.cost is None else sim[0].describe} simulated "
          f"{c['sim_speedup']:.2f}x against a cap of {c['sim_speedup_cap']:.2f}x.")
    print("why they differ: on a CPU a step's cost grows with the batch, so static batching's "
          "near-empty tail steps are cheap; on a memory-bound GPU a step costs about the same "
          "at 10 or 64 sequences, so the gain follows the step count.")
    print(f"the model's own words (greedy, chat template): \"What is the capital of France?\" "
          f"-> {text!r}")
    timing["total"] = time.perf_counter() - start
    print(f"total {timing['total']:.0f} s: model {timing['model']:.0f} s"
          f"{' (from a fresh cache)' if fresh else ''}, real engine "
          f"{timing['real_engine']:.0f} s, simulator {timing['simulator']:.0f} s")
    if options.json_out:
        payload = {"runs": [run.to_json() for run in real + sim], "comparison": c,
                   "sample_text": text, "timing_s": timing}
        failed = write_outputs([OutputFile.text("--json", options.json_out,
                                                lambda: json.dumps(payload, indent=2))])
        if failed:
            return report_error(failed)
    return 0
