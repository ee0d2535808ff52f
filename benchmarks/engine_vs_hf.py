"""stepserve against Hugging Face transformers on the same weights and the same requests.

The request stream is the scaled night-report job of `stepserve demo` (real prompts,
outputs of `--short` or `--long` tokens, ~10/64 long, EOS ignored), run with 64
requests in flight by four systems:

1. stepserve, continuous batching (`run_closed_loop`, 64 in flight);
2. stepserve, static batching (same loop; a batch runs until its last member ends);
3. transformers `generate`, static batches of 64 jobs in order: greedy, left padding
   with an attention mask, `max_new_tokens` = the longest request in the batch;
4. transformers' own continuous batching (`init_continuous_batching`), fed closed-loop:
   64 requests in flight, each with its own `max_new_tokens`, the next one added the
   moment one finishes.

Throughput counts useful tokens only: each request's own `max_tokens`, never padding
or the tokens a static batch generates past a request's end. All systems run float32
on the CPU without autograd. Then decode step time at batch 1/8/32/64 and context 64:
`TorchRunner.execute` (via `stepserve.profile.job.measure_step`) against a
transformers forward of one token per sequence on a `DynamicCache` holding 63.

    python benchmarks/engine_vs_hf.py [--requests 192] [--short 3] [--long 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from stepserve.config.settings import EngineConfig
from stepserve.core.request import SamplingParams
from stepserve.demo.job import demo_jobs
from stepserve.engine.llm_engine import LLMEngine, run_closed_loop
from stepserve.model.presets import resolve_model
from stepserve.model.runner import TorchRunner
from stepserve.model.tokenizer import Tokenizer
from stepserve.profile.job import measure_step

IN_FLIGHT = 64
GOAL_VS_HF_STATIC = 4.0
GOAL_VS_HF_CONTINUOUS = 2.0
Job = tuple[list[int], SamplingParams]


@dataclass
class SystemRun:
    """One system's pass over every job."""

    name: str
    requests: int
    useful_tokens: int = 0  # sum over requests of min(tokens produced, max_tokens)
    wall_s: float = 0.0
    generated_tokens: int = 0  # what the system computed, padding rows included
    same_tokens_as_stepserve: int | None = None  # requests whose output equals stepserve's
    note: str = ""
    error: str | None = None
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float | None:
        return self.useful_tokens / self.wall_s if self.wall_s > 0 and not self.error else None


@dataclass(frozen=True)
class StepTime:
    batch_size: int
    context_len: int
    stepserve_median_s: float
    hf_median_s: float
    repeats: int


def useful(outputs: list[list[int]], jobs: list[Job]) -> int:
    return sum(min(len(o), p.max_tokens) for o, (_, p) in zip(outputs, jobs, strict=True))


def run_stepserve(model_dir, batching: str, jobs: list[Job]) -> SystemRun:
    config = EngineConfig().replace(batching=batching, max_num_seqs=IN_FLIGHT,
                                    max_num_batched_tokens=4096, max_model_len=2048)
    engine = LLMEngine(model_dir, config)
    res = run_closed_loop(engine, jobs, IN_FLIGHT)
    engine.scheduler.kv.check_integrity()
    outputs = [list(r.output_token_ids) for r in res.requests]
    return SystemRun(f"stepserve {batching}", len(jobs), useful(outputs, jobs), res.duration_s,
                     sum(len(o) for o in outputs), note=f"LLMEngine batching={batching}, run_closed_loop "
                     f"{IN_FLIGHT} in flight", outputs=outputs)


def run_hf_static(model, jobs: list[Job]) -> SystemRun:
    pad = 0
    outputs: list[list[int]] = []
    generated = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(jobs), IN_FLIGHT):
            batch = jobs[start:start + IN_FLIGHT]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
            new = max(params.max_tokens for _, params in batch)
            gen = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                 pad_token_id=pad)
            rows = gen[:, width:]
            generated += rows.numel()
            outputs += [row[:params.max_tokens].tolist() for row, (_, params) in zip(rows, batch, strict=True)]
    wall = time.perf_counter() - t0
    return SystemRun("HF generate static", len(jobs), useful(outputs, jobs), wall, generated,
                     note=f"model.generate, batches of {IN_FLIGHT} in job order, left padding, "
                     "max_new_tokens = longest in batch", outputs=outputs)


def run_hf_continuous(model, jobs: list[Job]) -> SystemRun:
    """transformers' continuous batching, closed loop with per-request max_new_tokens."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    run = SystemRun("HF continuous", len(jobs))
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=1,
                                  pad_token_id=0)  # eos -1: "no EOS" in transformers' CB
    longest = max(len(ids) + p.max_tokens for ids, p in jobs)
    page = 256
    num_blocks = IN_FLIGHT * -(-longest // page) * 3 // 2  # every slot at its longest, + 50%
    cb_config = ContinuousBatchingConfig(page_size=page, num_blocks=num_blocks,
                                         max_batch_tokens=4096, max_requests_per_batch=IN_FLIGHT,
                                         allow_block_sharing=False)
    run.note = (f"init_continuous_batching + add_request(max_new_tokens=per request), "
                f"{IN_FLIGHT} in flight, max_requests_per_batch={IN_FLIGHT}, "
                f"max_batch_tokens=4096, {num_blocks} blocks of {page}, no prefix sharing, "
                f"attn={model.config._attn_implementation}")
    outputs: dict[int, list[int]] = {}
    manager = None
    try:
        with torch.no_grad():
            manager = model.init_continuous_batching(generation_config=gen_config,
                                                     continuous_batching_config=cb_config)
            manager.warmup()  # allocates the paged cache before the clock starts
            manager.start()
            index_of: dict[str, int] = {}

            def issue(i: int) -> None:
                ids, params = jobs[i]
                rid = manager.add_request(ids, request_id=f"job-{i}",
                                          max_new_tokens=params.max_tokens)
                index_of[rid] = i

            t0 = time.perf_counter()
            next_job = min(IN_FLIGHT, len(jobs))
            for i in range(next_job):
                issue(i)
            while len(outputs) < len(jobs):
                result = manager.get_result(timeout=5)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("generation thread stopped with "
                                           f"{len(jobs) - len(outputs)} requests unfinished")
                    continue
                if not result.is_finished():
                    continue
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id}: {result.error}")
                outputs[index_of[result.request_id]] = list(result.generated_tokens)
                if next_job < len(jobs):
                    issue(next_job)
                    next_job += 1
            run.wall_s = time.perf_counter() - t0
    except Exception as exc:  # report it in the table; the other systems still count
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        if manager is not None:
            manager.stop(block=True, timeout=30)
            manager.destroy()
    run.outputs = [outputs.get(i, []) for i in range(len(jobs))]
    run.useful_tokens = useful(run.outputs, jobs)
    run.generated_tokens = sum(len(o) for o in run.outputs)
    return run


def hf_decode_times(model, batch_size: int, context_len: int, repeats: int,
                    warmup: int) -> list[float]:
    """Forward of one token per sequence on a DynamicCache of context_len - 1 tokens, plus
    the greedy argmax; the cache is cropped back after each repeat so context stays fixed."""
    from transformers import DynamicCache

    prompt = torch.tensor([[(7 * i + j) % 500 + 3 for j in range(context_len - 1)]
                           for i in range(batch_size)])
    token = prompt[:, -1:]
    mask = torch.ones(batch_size, context_len, dtype=torch.long)
    times = []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prompt, cache=cache, use_cache=True)
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            out = model(token, attention_mask=mask, cache=cache, use_cache=True)
            out.logits[:, -1].argmax(-1)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            cache.crop(-1)  # drop the token just written
    return times


def step_times(model_dir, hf_model, batches: list[int], context_len: int,
               repeats: int) -> list[StepTime]:
    blocks = max(batches) * -(-context_len // 16) + 8
    runner = TorchRunner(model_dir, block_size=16, num_gpu_blocks=blocks)
    rows = []
    for b in batches:
        ours = measure_step(runner, b, context_len, repeats=repeats, warmup=2)
        theirs = hf_decode_times(hf_model, b, context_len, repeats, warmup=2)
        rows.append(StepTime(b, context_len, ours.median_s, statistics.median(theirs), repeats))
    return rows


def format_systems(runs: list[SystemRun], base: SystemRun) -> str:
    head = (f"{'system':<22}{'requests':>9}{'useful tok':>12}{'wall s':>9}{'useful tok/s':>14}"
            f"{'x HF static':>13}{'same tokens':>13}")
    lines = [head, "-" * len(head)]
    for r in runs:
        if r.error:
            lines.append(f"{r.name:<22}{r.requests:>9}  failed: {r.error}")
            continue
        ratio = (f"{r.tokens_per_s / base.tokens_per_s:.2f}x"
                 if base.tokens_per_s and r.tokens_per_s else "-")
        same = "-" if r.same_tokens_as_stepserve is None else \
            f"{r.same_tokens_as_stepserve}/{r.requests}"
        lines.append(f"{r.name:<22}{r.requests:>9}{r.useful_tokens:>12,}{r.wall_s:>9.1f}"
                     f"{r.tokens_per_s:>14.1f}{ratio:>13}{same:>13}")
    return "\n".join(lines)


def format_steps(rows: list[StepTime]) -> str:
    head = f"{'batch':>6}{'context':>9}{'stepserve ms':>14}{'HF forward ms':>15}{'HF / stepserve':>16}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.batch_size:>6}{r.context_len:>9}{r.stepserve_median_s * 1e3:>14.1f}"
                     f"{r.hf_median_s * 1e3:>15.1f}{r.hf_median_s / r.stepserve_median_s:>15.2f}x")
    return "\n".join(lines)


def ratio(a: SystemRun, b: SystemRun) -> float | None:
    return a.tokens_per_s / b.tokens_per_s if a.tokens_per_s and b.tokens_per_s else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=192, help="jobs in the request stream")
    ap.add_argument("--short", type=int, default=3, help="short output length (tokens)")
    ap.add_argument("--long", type=int, default=300, help="long output length (tokens)")
    ap.add_argument("--step-repeats", type=int, default=10, help="timed repeats per step size")
    ap.add_argument("--json", metavar="OUT", help="also write every number as JSON")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    t_start = time.perf_counter()
    model_dir = resolve_model("default")
    jobs, lengths = demo_jobs(Tokenizer(model_dir), args.requests, args.short, args.long)
    num_long = sum(n == args.long for n in lengths)
    print(f"model {model_dir}, float32, CPU, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"jobs: {len(jobs)} night-report requests, outputs {args.short} or {args.long} tokens "
          f"({num_long} long), {IN_FLIGHT} in flight", flush=True)

    def done(run: SystemRun) -> SystemRun:
        state = f"failed: {run.error}" if run.error else f"{run.wall_s:.1f} s"
        print(f"  {run.name}: {state}", flush=True)
        return run

    ours = done(run_stepserve(model_dir, "continuous", jobs))
    gc.collect()
    ours_static = done(run_stepserve(model_dir, "static", jobs))
    gc.collect()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # neither stop at EOS nor suppress it
    hf_static = done(run_hf_static(hf, jobs))
    hf_cont = done(run_hf_continuous(hf, jobs))
    runs = [ours, ours_static, hf_static, hf_cont]
    for r in runs:
        if not r.error:
            r.same_tokens_as_stepserve = sum(a == b for a, b in zip(r.outputs, ours.outputs, strict=True))
    print("  decode step times ...", flush=True)
    steps = step_times(model_dir, hf, [1, 8, 32, 64], 64, args.step_repeats)

    vs_static, vs_cont = ratio(ours, hf_static), ratio(ours, hf_cont)

    def verdict(value: float | None, goal: float) -> str:
        if value is None:
            return f"not measured (goal >= {goal:.0f}x)"
        return f"{value:.2f}x (goal >= {goal:.0f}x: {'met' if value >= goal else 'NOT met'})"

    print("")
    print(format_systems(runs, hf_static))
    print("")
    print(f"stepserve continuous / HF static:     {verdict(vs_static, GOAL_VS_HF_STATIC)}")
    print(f"stepserve continuous / HF continuous: {verdict(vs_cont, GOAL_VS_HF_CONTINUOUS)}")
    print("same tokens: requests whose greedy output equals stepserve continuous's, token "
          "for token")
    print("")
    print("decode step, one new token per sequence (median of "
          f"{args.step_repeats} after 2 warm-up):")
    print(format_steps(steps))
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json:
        payload = {
            "benchmark": "engine_vs_hf", "command": " ".join(["python", *sys.argv]),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "torch_threads": torch.get_num_threads(), "model": str(model_dir),
            "jobs": {"requests": len(jobs), "short": args.short, "long": args.long,
                     "num_long": num_long, "in_flight": IN_FLIGHT,
                     "useful_tokens": sum(lengths)},
            "systems": [{**{k: v for k, v in asdict(r).items() if k != "outputs"},
                         "useful_tokens_per_s": r.tokens_per_s} for r in runs],
            "ratios": {"stepserve_continuous_over_hf_static": vs_static,
                       "stepserve_continuous_over_hf_continuous": vs_cont,
                       "goal_vs_hf_static": GOAL_VS_HF_STATIC,
                       "goal_vs_hf_continuous": GOAL_VS_HF_CONTINUOUS,
                       "met_vs_hf_static": vs_static is not None
                       and vs_static >= GOAL_VS_HF_STATIC,
                       "met_vs_hf_continuous": vs_cont is not None
                       and vs_cont >= GOAL_VS_HF_CONTINUOUS},
            "decode_step_times": [asdict(s) for s in steps],
            "total_s": time.perf_counter() - t_start,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
