"""How fast the simulator runs the real scheduler: microseconds per request-iteration
(one request scheduled in one step), on a 10,000-request Poisson workload with mean
prompt ~1,100 and mean output ~210 tokens and a batch cap of 128.

Reference point: Vidur reports about 15 us per request-iteration (its paper; not run
here). The goal is 10x faster, i.e. 1.5 us, with the real scheduler inside.

    python benchmarks/sim_speed.py [--requests 10000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from stepserve.config.settings import EngineConfig
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.calibrated import CalibratedCost
from stepserve.sim.cost import ConstantCost
from stepserve.sim.cost_options import load_cost_file
from stepserve.sim.loop import simulate
from stepserve.sim.roofline import RooflineCost, get_hardware
from stepserve.workload.arrivals import Poisson
from stepserve.workload.lengths import lognormal
from stepserve.workload.spec import RequestClass, Workload

VIDUR_US_PER_REQUEST_ITERATION = 15.0
# a calibrated model with step times of the roofline's order (its terms are what cost
# time to evaluate, not their values)
CALIBRATED = CalibratedCost({"step": 0.006, "seq": 20e-6, "token": 60e-6, "token_hi": 0.0,
                             "kv_read": 2e-9, "attn": 1e-10, "swap": 50e-6}, 64)


def workload(n: int) -> Workload:
    # lognormal P50 970 / P99 3,000 has mean ~1,100; P50 150 / P99 1,000 has mean ~210
    cls = RequestClass("all", 1.0, lognormal(970, 3000, max=4000), lognormal(150, 1000, max=2000))
    return Workload("sim-speed", (cls,), Poisson(12.0), n, seed=0)


def measure(name: str, cost, specs, config: EngineConfig, blocks: int) -> dict:
    t0 = time.perf_counter()
    sim = simulate(config, specs, cost, blocks)
    wall = time.perf_counter() - t0
    iterations = sum(s.num_scheduled_seqs for per in sim.steps for s in per)
    steps = sum(len(per) for per in sim.steps)
    return {"cost_model": name, "wall_s": wall, "request_iterations": iterations,
            "steps": steps, "us_per_request_iteration": wall / iterations * 1e6,
            "us_per_step": wall / steps * 1e6, "simulated_s": sim.duration_s,
            "speed_vs_vidur": VIDUR_US_PER_REQUEST_ITERATION / (wall / iterations * 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--cost", metavar="FILE", help="a cost file (`stepserve profile`) for "
                    "the calibrated row (default: a GPU-like calibrated model)")
    args = ap.parse_args()
    wl = workload(args.requests)
    specs = wl.generate()
    mean_prompt = sum(s.prompt_len for s in specs) / len(specs)
    mean_output = sum(s.output_len for s in specs) / len(specs)
    config = EngineConfig().replace(max_num_seqs=128, max_num_batched_tokens=8192,
                                    max_model_len=8192)
    spec = get_model_spec("llama-3-8b")
    roofline = RooflineCost(get_hardware("h100"), spec)
    blocks = roofline.kv_cache_bytes() // (spec.kv_bytes_per_token * 16)
    calibrated = load_cost_file(args.cost) if args.cost else CALIBRATED
    rows = [measure("constant 25 ms", ConstantCost(0.025), specs, config, blocks),
            measure("roofline h100 llama-3-8b", roofline, specs, config, blocks),
            measure("calibrated (7 terms)", calibrated, specs, config, blocks)]
    print(f"workload: {len(specs)} Poisson requests, mean prompt {mean_prompt:.0f}, "
          f"mean output {mean_output:.0f}, max_num_seqs 128, {blocks} KV blocks")
    print(f"{'cost model':<26}{'req-iters':>12}{'steps':>9}{'wall s':>9}"
          f"{'us/req-iter':>13}{'x Vidur 15us':>14}")
    for r in rows:
        print(f"{r['cost_model']:<26}{r['request_iterations']:>12,}{r['steps']:>9,}"
              f"{r['wall_s']:>9.2f}{r['us_per_request_iteration']:>13.2f}"
              f"{r['speed_vs_vidur']:>13.1f}x")
    result = {"benchmark": "sim_speed", "python": platform.python_version(),
              "machine": platform.machine(), "requests": len(specs),
              "mean_prompt": mean_prompt, "mean_output": mean_output,
              "vidur_reference_us": VIDUR_US_PER_REQUEST_ITERATION,
              "us_per_request_iteration": rows[1]["us_per_request_iteration"], "runs": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
