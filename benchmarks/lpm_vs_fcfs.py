"""Longest cached prefix first against first come, first served, on the simulator: one
replica under a mixed load that queues, where most requests ("warm") open with one of a few
long system prompts the cache holds and the rest ("cold") share nothing.

While a queue stands, `lpm` admits the requests whose prompts the cache already holds
first: each costs a short prefill, so more of them start per step and warm TTFT falls. A
cold request waits behind them; `aging_after_s` bounds that wait (one waiting that long
goes ahead of younger ones), as the other policies' aging does. The same requests run
under fcfs, lpm without aging, and lpm with aging.

Step times are the roofline's (H100, Llama-3-8B): a cached prefix is prefill not paid.
Columns: TTFT P50/P99 of each class, output tokens per second, the prefix-cache hit rate.

    python benchmarks/lpm_vs_fcfs.py                 # 2,000 requests at 17/s, ~20 s
    python benchmarks/lpm_vs_fcfs.py --aging 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from stepserve.config.settings import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.sim.run import simulate_run
from stepserve.workload.loader import workload_from_dict


def workload(args: argparse.Namespace) -> dict:
    # the same prompt lengths in both classes: a warm prompt is its system prompt
    # (prefix_len tokens, added by the class) and 64-512 tokens of its own
    own = {"uniform": [64, 512]}
    whole = {"uniform": [args.prefix_len + 64, args.prefix_len + 512]}
    output = {"uniform": [32, 256]}
    return {
        "name": "warm-and-cold", "seed": args.seed, "num_requests": args.requests,
        "arrival": {"poisson": {"rate": args.rate}},
        "classes": [
            {"name": "warm", "share": 1 - args.cold_share, "prompt": own,
             "output": output, "shared_prefixes": args.prefixes,
             "prefix_len": args.prefix_len},
            {"name": "cold", "share": args.cold_share, "prompt": whole, "output": output},
        ],
    }


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


def run(name: str, policy: str, aging: float, args: argparse.Namespace) -> dict:
    specs = workload_from_dict(workload(args)).generate()
    config = EngineConfig().replace(policy=policy, aging_after_s=aging,
                                    max_num_seqs=args.max_num_seqs,
                                    num_gpu_blocks=args.num_gpu_blocks)
    cost = RooflineCost(get_hardware("h100"), get_model_spec("llama-3-8b"))
    result, sim = simulate_run(name, config, specs, cost, args.num_gpu_blocks, None)
    row: dict = {"run": name, "policy": policy, "aging_after_s": aging}
    for cls in ("warm", "cold"):
        ttfts = [r.ttft for r in sim.requests if r.request_class == cls and r.ttft is not None]
        row[f"{cls}_requests"] = len(ttfts)
        row[f"{cls}_ttft_p50_s"] = pct(ttfts, 50)
        row[f"{cls}_ttft_p99_s"] = pct(ttfts, 99)
    rejected = [r for r in sim.requests if r.ttft is None]
    if rejected:
        raise SystemExit(f"{name}: {len(rejected)} requests never started "
                         f"({rejected[0].finish_reason}); the load does not fit the settings")
    cached = sum(r.num_cached_tokens for r in sim.requests)
    prompt = sum(r.num_prompt_tokens for r in sim.requests)
    s = result.summary
    row.update(hit_rate=cached / prompt, output_tokens_per_s=s.throughput_tokens_per_s,
               finished=s.requests_finished, requests=len(specs))
    return row


def table(rows: list[dict]) -> str:
    ms = 1e3
    lines = [f"{'run':<16} {'warm P50':>9} {'warm P99':>9} {'cold P50':>9} {'cold P99':>9} "
             f"{'out tok/s':>10} {'hit rate':>8}"]
    for r in rows:
        lines.append(
            f"{r['run']:<16} {r['warm_ttft_p50_s'] * ms:>7.0f}ms {r['warm_ttft_p99_s'] * ms:>7.0f}ms "
            f"{r['cold_ttft_p50_s'] * ms:>7.0f}ms {r['cold_ttft_p99_s'] * ms:>7.0f}ms "
            f"{r['output_tokens_per_s']:>10,.0f} {r['hit_rate']:>8.1%}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate", type=float, default=17.0, help="requests per second, Poisson "
                   "(17: just over what fcfs serves without a standing queue)")
    p.add_argument("--cold-share", type=float, default=0.2)
    p.add_argument("--prefixes", type=int, default=4, help="system prompts of the warm class")
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-gpu-blocks", type=int, default=4096)
    p.add_argument("--aging", type=float, default=3.0, help="lpm's aging_after_s (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = p.parse_args()
    rows = [run("fcfs", "fcfs", 0.0, args), run("lpm", "lpm", 0.0, args),
            run(f"lpm, aging {args.aging:g}s", "lpm", args.aging, args)]
    print(f"{args.requests} requests at {args.rate:g}/s (Poisson), {args.cold_share:.0%} cold; "
          f"warm: {args.prefixes} system prompts of {args.prefix_len} tokens; "
          f"{args.num_gpu_blocks} KV blocks, max_num_seqs {args.max_num_seqs} "
          "(H100 roofline, Llama-3-8B)")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "runs": rows}, f, indent=2)


if __name__ == "__main__":
    main()
