"""Decode steps of the default model against the memory-bandwidth floor, per weight mode.

1. This machine's memory bandwidth: a plain torch copy of `--copy-mb` MB, repeated; GB/s
   counts the bytes read plus the bytes written (STREAM's convention), best of the
   repeats. Measured at the start of every round, next to the steps it is the floor of:
   on a shared machine the bandwidth a neighbour leaves moves by half within minutes
   (this EPYC: 35-47 GB/s mostly, now and then 58-73), so a floor from one moment
   against steps from another would compare two machines.
2. For each weight mode (`--modes quantization/dtype,...`, see stepserve/model/modes.py):
   `TorchRunner.execute` decode steps at batch 1, 2, 4, 8, 16, 32 and context `--context`
   (`stepserve.profile.job.measure_step`), and one prefill chunk of `--prefill`
   tokens alone. The floor of a step is the bytes of weights it streams once (every
   layer, the final norm and the head; the embedding only when tied to the head) divided
   by the copy bandwidth; the table prints each median step and its ratio to the floor.
   The issue's goal: batch-1 decode within 1.5x of its floor.
   Sizes run in rounds, every mode back to back within a round; a cell is the median
   over rounds of the per-round median step, and its ratio the median over rounds of the
   step against that round's own floor.
3. `--agreement N`: greedy agreement of each mode with none/float32 (the float32 path on
   the same dequantised weights) over N prompts x `--agreement-tokens` tokens
   (stepserve/model/agreement.py: free-running sequences, teacher-forced flips).

    python benchmarks/bandwidth.py [--modes none/float32,q4_1/float32,none/bfloat16]
        [--rounds 3] [--repeats 10] [--agreement 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from stepserve.model.modes import MODES, streamed_weight_nbytes
from stepserve.model.runner import TorchRunner
from stepserve.model.weights import DTYPES
from stepserve.profile.job import measure_step

DEFAULT_MODES = "none/float32,q4_1/float32,none/bfloat16"
BATCHES = (1, 2, 4, 8, 16, 32)
GOAL_BATCH1_RATIO = 1.5
COPY_REPEATS = 10  # copies a round's bandwidth is the best of


@dataclass(frozen=True)
class Bandwidth:
    copy_mb: int
    repeats: int
    best_gbs: float
    median_gbs: float


@dataclass
class ModeRun:
    mode: str  # quantization/dtype
    describe: str
    streamed_bytes: int
    load_s: float
    decode_ms: dict[int, float] = field(default_factory=dict)  # batch -> median step
    decode_rounds_ms: dict[int, list[float]] = field(default_factory=dict)
    floor_ratio: dict[int, float] = field(default_factory=dict)  # batch -> median ratio
    prefill_ms: float | None = None
    agreement: dict[str, object] | None = None

    def floor_ms(self, gbs: float) -> float:
        return self.streamed_bytes / (gbs * 1e9) * 1e3

    def summarise(self, rounds_gbs: list[float]) -> None:
        """Each cell's median step, and its median ratio to its own round's floor."""
        self.decode_ms = {b: statistics.median(v) for b, v in self.decode_rounds_ms.items()}
        self.floor_ratio = {
            b: statistics.median(ms / self.floor_ms(gbs) for ms, gbs in zip(v, rounds_gbs))
            for b, v in self.decode_rounds_ms.items()}


def measure_bandwidth(copy_mb: int, repeats: int) -> Bandwidth:
    src = torch.ones(copy_mb * (1 << 20) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page before timing
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * src.nbytes / (time.perf_counter() - t0) / 1e9)
    return Bandwidth(copy_mb, repeats, max(rates), statistics.median(rates))


def load_runner(mode: str, blocks: int) -> tuple[TorchRunner, float]:
    quantization, dtype = mode.split("/")
    t0 = time.perf_counter()
    runner = TorchRunner("default", num_gpu_blocks=blocks, quantization=quantization,
                         dtype=dtype)
    return runner, time.perf_counter() - t0


def time_modes(runners: dict[str, TorchRunner], runs: dict[str, ModeRun], batches: list[int],
               context: int, prefill: int, rounds: int, repeats: int,
               copy_mb: int) -> list[Bandwidth]:
    """Every round: the copy bandwidth, then each batch size in every mode."""
    bandwidths = []
    for r in range(rounds):
        bandwidths.append(measure_bandwidth(copy_mb, COPY_REPEATS))
        for b in batches:
            for mode, runner in runners.items():
                t = measure_step(runner, b, context, repeats=repeats)
                runs[mode].decode_rounds_ms.setdefault(b, []).append(t.median_s * 1e3)
        print(f"  round {r + 1}/{rounds}: copy {bandwidths[-1].best_gbs:.1f} GB/s, decode "
              "done", flush=True)
    for mode, runner in runners.items():
        run = runs[mode]
        run.summarise([bw.best_gbs for bw in bandwidths])
        if prefill:
            t = measure_step(runner, 0, context, prefill_tokens=prefill,
                             repeats=max(2, repeats // 3))
            run.prefill_ms = t.median_s * 1e3
    return bandwidths


def format_table(runs: list[ModeRun], median_gbs: float, batches: list[int],
                 prefill: int) -> str:
    head = (f"{'mode':<16}{'weights':>9}{'floor':>8}" + "".join(f"{f'b={b}':>15}" for b in batches)
            + (f"{f'prefill {prefill}':>14}" if prefill else ""))
    lines = [head, "-" * len(head)]
    for run in runs:
        cells = "".join(f"{run.decode_ms[b]:>8.1f} {run.floor_ratio[b]:>5.2f}x"
                        for b in batches)
        pre = f"{run.prefill_ms:>12.0f}ms" if run.prefill_ms is not None else ""
        lines.append(f"{run.mode:<16}{run.streamed_bytes / 1e6:>7.0f}MB"
                     f"{run.floor_ms(median_gbs):>6.1f}ms{cells}{pre}")
    lines.append("cells: median decode step (ms) and its median ratio to its round's floor "
                 "(streamed weight bytes / that round's copy bandwidth); floor column: at "
                 f"the rounds' median, {median_gbs:.1f} GB/s")
    return "\n".join(lines)


def format_agreement(runs: list[ModeRun]) -> str:
    lines = [f"{'mode':<16}{'same seqs':>11}{'tokens before 1st flip':>25}"
             f"{'forced flips':>15}{'median gap':>12}"]
    for run in runs:
        a = run.agreement
        if a is None:
            continue
        gap = a["median_flip_gap"]
        lines.append(f"{run.mode:<16}{a['identical_sequences']:>5}/{a['prompts']:<5}"
                     f"{a['tokens_before_divergence']:>10}/{a['prompts'] * a['max_tokens']:<6}"
                     f"({a['free_running_agreement']:.1%})"
                     f"{a['forced_flips']:>8}/{a['forced_positions']:<6}"
                     f"{'-' if gap is None else f'{gap:.3f}':>12}")
    lines.append("reference none/float32; forced: the mode's argmax on the reference's own "
                 "text; gap: the reference's top-2 logit gap where the mode flipped")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=DEFAULT_MODES,
                    help="comma-separated quantization/dtype pairs (none, q4_1)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    help="decode batch sizes")
    ap.add_argument("--context", type=int, default=64, help="tokens each decode attends to")
    ap.add_argument("--prefill", type=int, default=256,
                    help="prefill chunk timed alone (0: skip)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every size and mode")
    ap.add_argument("--repeats", type=int, default=10, help="timed steps per cell per round")
    ap.add_argument("--copy-mb", type=int, default=256, help="size of the copy benchmark")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--agreement", type=int, default=0, metavar="N",
                    help="also measure greedy agreement with none/float32 over N prompts")
    ap.add_argument("--agreement-tokens", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--json", metavar="OUT", help="also write every number as JSON")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        quantization, _, dtype = mode.partition("/")
        if quantization not in MODES or dtype not in DTYPES:
            ap.error(f"--modes: {mode!r} is not quantization/dtype (quantization one of "
                     f"{', '.join(MODES)}; dtype one of {', '.join(DTYPES)})")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches: {args.batches!r} is not a comma-separated list of integers")
    if not modes or not batches or min(batches) < 1:
        ap.error("--modes and --batches need at least one entry; batch sizes are >= 1")
    t_start = time.perf_counter()
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()})", flush=True)
    blocks = max(batches) * -(-(args.context + 1) // 16) + -(-args.prefill // 16) + 8
    runners, runs = {}, {}
    for mode in modes:
        runner, load_s = load_runner(mode, max(blocks, 2 * 32 * 12))
        runners[mode] = runner
        runs[mode] = ModeRun(mode, runner.describe(), streamed_weight_nbytes(runner.model),
                             load_s)
        print(f"  {mode}: loaded in {load_s:.1f} s, {runs[mode].streamed_bytes / 1e6:.0f} MB "
              "streamed per step", flush=True)
    bandwidths = time_modes(runners, runs, batches, args.context, args.prefill, args.rounds,
                            args.repeats, args.copy_mb)
    median_gbs = statistics.median(bw.best_gbs for bw in bandwidths)
    print(f"memory bandwidth, torch copy of {args.copy_mb} MB, best of {COPY_REPEATS} per "
          f"round: {', '.join(f'{bw.best_gbs:.1f}' for bw in bandwidths)} GB/s", flush=True)
    if args.agreement:
        from stepserve.model.agreement import agreement_prompts, measure_agreement

        reference = runners.get("none/float32") or load_runner("none/float32", 2 * 32 * 12)[0]
        prompts = agreement_prompts(reference.tokenizer, args.agreement)
        for mode, runner in runners.items():
            if mode == "none/float32":
                continue
            print(f"  agreement {mode} ...", flush=True)
            runs[mode].agreement = measure_agreement(reference, runner, prompts,
                                                     args.agreement_tokens).summary()
    gc.collect()
    print("")
    print(format_table(list(runs.values()), median_gbs, batches, args.prefill))
    batch1 = [r for r in runs.values() if 1 in r.decode_ms]
    if batch1:
        best = min(batch1, key=lambda r: r.decode_ms[1])
        ratio = best.floor_ratio[1]
        print(f"fastest batch-1 mode {best.mode}: {ratio:.2f}x its floor (goal <= "
              f"{GOAL_BATCH1_RATIO}x: {'met' if ratio <= GOAL_BATCH1_RATIO else 'NOT met'})")
    if args.agreement:
        print("")
        print(format_agreement(list(runs.values())))
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python benchmarks/bandwidth.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                if v not in (None, 0) and k != "json"),
                "torch": torch.__version__, "threads": torch.get_num_threads(),
                "bandwidth_rounds": [asdict(bw) for bw in bandwidths],
                "median_gbs": median_gbs, "batches": batches, "context": args.context,
                "prefill_tokens": args.prefill,
                "modes": [asdict(r) | {"floor_ms_at_median": r.floor_ms(median_gbs)}
                          for r in runs.values()]}, f, indent=2)


if __name__ == "__main__":
    main()
