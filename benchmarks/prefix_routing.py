"""Prefix-aware routing against routers blind to the prompt, on the simulator: 4 replicas,
a multi-tenant chat workload whose requests open with one of 32 system prompts, Poisson
arrivals; the same requests under prefix_affinity, least_outstanding and round_robin.

Each replica's KV holds about a quarter of the system prompts besides its running
requests (the default 1,024 blocks of 16 tokens; 32 prompts of 1,024 tokens are 2,048
blocks), so a router that spreads each prompt over every replica keeps evicting them.
Step times are the roofline's (H100, Llama-3-8B): a cached prefix is prefill not paid.

Columns: the prefix-cache hit rate (prompt tokens served from the cache over all prompt
tokens), TTFT P50/P99, output tokens per second, requests per second.

    python benchmarks/prefix_routing.py                    # 2,000 requests at 24/s
    python benchmarks/prefix_routing.py --rate 32 --json out.json
"""

from __future__ import annotations

import argparse
import json

from stepserve.config.settings import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.sim.run import simulate_run
from stepserve.workload.loader import workload_from_dict

ROUTERS = ("prefix_affinity", "least_outstanding", "round_robin")


def workload(args: argparse.Namespace) -> dict:
    return {
        "name": "prefix-routing", "seed": args.seed, "num_requests": args.requests,
        "arrival": {"poisson": {"rate": args.rate}},
        "classes": [{"name": "chat", "prompt": {"uniform": [64, 512]},
                     "output": {"uniform": [32, 256]},
                     "shared_prefixes": args.prefixes, "prefix_len": args.prefix_len}],
    }


def run(router: str, args: argparse.Namespace) -> dict:
    specs = workload_from_dict(workload(args)).generate()
    config = EngineConfig().replace(replicas=args.replicas, router=router,
                                    max_num_seqs=args.max_num_seqs,
                                    num_gpu_blocks=args.num_gpu_blocks)
    cost = RooflineCost(get_hardware("h100"), get_model_spec("llama-3-8b"))
    result, sim = simulate_run(router, config, specs, cost, args.num_gpu_blocks, None)
    cached = sum(r.num_cached_tokens for r in sim.requests)
    prompt = sum(r.num_prompt_tokens for r in sim.requests)
    s = result.summary
    return {"router": router, "hit_rate": cached / prompt, "ttft_p50_s": s.ttft_p50_s,
            "ttft_p99_s": s.ttft_p99_s, "output_tokens_per_s": s.throughput_tokens_per_s,
            "requests_per_s": s.throughput_requests_per_s,
            "finished": s.requests_finished, "requests": len(specs)}


def table(rows: list[dict]) -> str:
    lines = [f"{'router':<18} {'hit rate':>8} {'TTFT P50':>9} {'TTFT P99':>9} "
             f"{'out tok/s':>10} {'req/s':>6}"]
    for r in rows:
        lines.append(f"{r['router']:<18} {r['hit_rate']:>8.1%} {r['ttft_p50_s'] * 1e3:>7.0f}ms "
                     f"{r['ttft_p99_s'] * 1e3:>7.0f}ms {r['output_tokens_per_s']:>10,.0f} "
                     f"{r['requests_per_s']:>6.1f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate", type=float, default=24.0, help="requests per second, Poisson")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--prefixes", type=int, default=32, help="system prompts")
    p.add_argument("--prefix-len", type=int, default=1024, help="tokens per system prompt")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--num-gpu-blocks", type=int, default=1024, help="per replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = p.parse_args()
    rows = [run(router, args) for router in ROUTERS]
    print(f"{args.replicas} replicas, {args.requests} requests at {args.rate:g}/s, "
          f"{args.prefixes} system prompts of {args.prefix_len} tokens, "
          f"{args.num_gpu_blocks} KV blocks per replica (H100 roofline, Llama-3-8B)")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "runs": rows}, f, indent=2)


if __name__ == "__main__":
    main()
