"""1 vs 2 engine replicas on Ray Serve through the ingress, against the single-process
server, on the same closed-loop load; and the latency one ingress hop adds.

Three servers, each `stepserve serve` in a subprocess with the same engine settings:
  single      the single-process server (no Ray)
  ingress-1   the ingress over 1 replica (a pools file with `replicas: 1`)
  ingress-2   the ingress over 2 replicas (`--replicas 2`, round-robin)
For each: `concurrency` asyncio clients in this process stream /v1/completions in a
closed loop (the next request the moment one ends; same prompt ids, greedy, ignore_eos):
output tokens per second and TTFT P50/P99. Then `--hops` sequential one-token requests
(no load): end-to-end latency P50/P99; ingress-1 minus single is what the hop to a
replica (Ray Serve's router, the handle call, the streamed outputs) costs.

    python benchmarks/replicas.py                       # tiny model, 256 requests, C=16
    python benchmarks/replicas.py --quick --json out.json

On a machine with few cores, replicas compete with each other and with Ray's own
processes for the same cores: 2 replicas gain throughput only when cores are free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from server_overhead import free_port, stream_one, wait_healthy  # noqa: E402

SERVERS = ("single", "ingress-1", "ingress-2")


def percentile(values: list[float], q: float) -> float:
    from stepserve.metrics.percentiles import percentile as pct

    return pct(values, q)


def serve_flags(args, name: str, pools: Path) -> list[str]:
    flags = ["--model", args.model, "--max-num-seqs", str(args.concurrency),
             "--num-gpu-blocks", str(args.num_gpu_blocks), "--max-model-len",
             str(args.max_model_len), "--log-level", "warning"]
    if name == "ingress-1":
        flags += ["--pools", str(pools)]
    elif name == "ingress-2":
        flags += ["--replicas", "2"]
    return flags


async def timed_stream(client, url: str, model: str, ids: list[int], max_tokens: int
                       ) -> tuple[float, float, int]:
    """(TTFT, end-to-end latency, output tokens) of one streamed request."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.perf_counter() - t0,
            time.perf_counter() - t0, tokens)


async def closed_loop(url: str, model: str, jobs, concurrency: int) -> dict:
    import httpx

    queue = list(jobs)
    results: list[tuple[float, float, int]] = []

    async def worker(client) -> None:
        while queue:
            ids, max_tokens = queue.pop()
            results.append(await timed_stream(client, url, model, ids, max_tokens))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        duration = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    tokens = sum(r[2] for r in results)
    return {"requests": len(results), "output_tokens": tokens, "duration_s": duration,
            "tokens_per_s": tokens / duration, "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99)}


async def hop_latency(url: str, model: str, n: int) -> dict:
    """Sequential one-token requests: what a request costs with no load."""
    import httpx

    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(3):  # warm up connections and paths
            await stream_one(client, url, model, [5, 6, 7], 1)
        lat = []
        for _ in range(n):
            lat.append((await timed_stream(client, url, model, [5, 6, 7], 1))[1])
    return {"hop_p50_s": percentile(lat, 50), "hop_p99_s": percentile(lat, 99)}


def run_server(args, name: str, pools: Path, jobs) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "stepserve", "serve",
                             *serve_flags(args, name, pools), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        asyncio.run(wait_healthy(url, proc, timeout=600))
        asyncio.run(closed_loop(url, args.model, jobs[: args.concurrency], args.concurrency))
        load = asyncio.run(closed_loop(url, args.model, jobs, args.concurrency))
        hops = asyncio.run(hop_latency(url, args.model, args.hops))
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"server": name, **load, **hops}


def make_jobs(n: int, prompt_len: int, max_tokens: int, seed: int):
    rng = random.Random(seed)
    return [([rng.randrange(3, 500) for _ in range(prompt_len)], max_tokens)
            for _ in range(n)]


def table(rows: list[dict]) -> str:
    single = next((r for r in rows if r["server"] == "single"), None)
    lines = [f"{'server':<10} {'tok/s':>9} {'TTFT P50':>9} {'TTFT P99':>9} "
             f"{'hop P50':>9} {'hop P99':>9} {'hop - single':>13}"]
    for r in rows:
        extra = "" if single is None or r is single else \
            f"{(r['hop_p50_s'] - single['hop_p50_s']) * 1e3:+.1f} ms"
        lines.append(f"{r['server']:<10} {r['tokens_per_s']:>9.1f} "
                     f"{r['ttft_p50_s'] * 1e3:>7.1f}ms {r['ttft_p99_s'] * 1e3:>7.1f}ms "
                     f"{r['hop_p50_s'] * 1e3:>7.1f}ms {r['hop_p99_s'] * 1e3:>7.1f}ms "
                     f"{extra:>13}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--hops", type=int, default=100, help="sequential one-token requests")
    p.add_argument("--num-gpu-blocks", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--servers", default=",".join(SERVERS),
                   help=f"which to run, of {', '.join(SERVERS)}")
    p.add_argument("--quick", action="store_true",
                   help="a check that it runs: 16 requests, 8 hops, C=4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    if args.quick:
        args.requests, args.hops, args.concurrency, args.max_tokens = 16, 8, 4, 16
    names = [n for n in args.servers.split(",") if n]
    unknown = set(names) - set(SERVERS)
    if unknown:
        p.error(f"--servers: unknown {sorted(unknown)}; choose from {', '.join(SERVERS)}")
    jobs = make_jobs(args.requests, args.prompt_len, args.max_tokens, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        pools = Path(tmp) / "one-replica.yaml"
        pools.write_text("replicas: 1\n")
        rows = []
        for name in names:
            print(f"{name}: starting", file=sys.stderr)
            rows.append(run_server(args, name, pools, jobs))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
