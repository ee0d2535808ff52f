"""What the HTTP server costs: output tokens per second through HTTP streaming at N
concurrent clients, against the in-process engine on the same workload, side by side.

Both sides run the same closed loop: `concurrency` requests in flight, the next sent the
moment one ends, every request the same (prompt ids, max_tokens, greedy, ignore_eos).
In-process: engine/llm_engine.run_closed_loop on an LLMEngine. HTTP: `stepserve serve`
in a subprocess (its own engine, same settings), and `concurrency` asyncio clients in
this process streaming /v1/completions (httpx, SSE parsed by hand; output tokens from
the final `usage` chunk). Goal: HTTP >= 90% of in-process.

    python benchmarks/server_overhead.py --model tiny --requests 256 --concurrency 64
    python benchmarks/server_overhead.py --model default --requests 128 --max-tokens 32

Measured on 2 shared cores (another process using ~1.3 of them): default (SmolLM2-135M)
232.0 vs 248.7 tok/s = 93.3%; tiny (0.3M params, ~5 ms steps) 3,791 vs 12,248 tok/s =
31%: there the per-token cost of HTTP in Python outweighs the model's work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVE = ("import sys, argparse; from stepserve.cli.serve import add_serve_parser; "
         "p = argparse.ArgumentParser(); add_serve_parser(p.add_subparsers()); "
         "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")


def make_jobs(n: int, prompt_len: int, max_tokens: int, vocab: int, seed: int
              ) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        length = rng.randint(max(prompt_len // 2, 1), prompt_len * 3 // 2)
        jobs.append(([rng.randrange(3, vocab) for _ in range(length)], max_tokens))
    return jobs


def settings(args) -> dict:
    return dict(max_num_seqs=args.concurrency, num_gpu_blocks=args.num_gpu_blocks,
                max_model_len=args.max_model_len)


def load_engine(args):
    from stepserve.config.settings import EngineConfig
    from stepserve.core.request import SamplingParams
    from stepserve.engine.llm_engine import LLMEngine, run_closed_loop

    engine = LLMEngine(args.model, EngineConfig().replace(**settings(args)))
    warm = [(ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            for ids in ([5] * 8, [6] * 8)]
    run_closed_loop(engine, warm, 1)
    return engine


def run_in_process(engine, args, jobs) -> dict:
    from stepserve.core.request import SamplingParams
    from stepserve.engine.llm_engine import run_closed_loop

    work = [(ids, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
            for ids, m in jobs]
    # On a worker thread, as the server's engine loop runs: on a loaded 2-core machine
    # torch's intra-op threads behaved very differently from the main thread (measured
    # 240 vs 11,000 tok/s on the same engine), which would compare threads, not HTTP.
    box = {}
    worker = threading.Thread(target=lambda: box.update(
        res=run_closed_loop(engine, work, args.concurrency)))
    worker.start()
    worker.join()
    res = box["res"]
    tokens = sum(r.num_output_tokens for r in res.requests)
    return {"mode": "in-process", "requests": len(res.requests), "output_tokens": tokens,
            "duration_s": res.duration_s, "tokens_per_s": tokens / res.duration_s}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int) -> subprocess.Popen:
    flags = []
    for key, value in settings(args).items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    return subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--model", args.model, "--port", str(port),
         "--log-level", "warning", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(url + "/health", timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {proc.stderr.read()}")
            await asyncio.sleep(0.2)


async def stream_one(client, url: str, model: str, ids: list[int], max_tokens: int) -> int:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError("stream ended without a usage chunk")
    return tokens


async def http_closed_loop(url: str, model: str, jobs, concurrency: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4,
                          max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        await stream_one(client, url, model, jobs[0][0], 4)  # warm-up
        queue = list(reversed(jobs))
        totals = []

        async def worker() -> None:
            while queue:
                ids, m = queue.pop()
                totals.append(await stream_one(client, url, model, ids, m))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        duration = time.perf_counter() - start
    tokens = sum(totals)
    return {"mode": "http-streaming", "requests": len(totals), "output_tokens": tokens,
            "duration_s": duration, "tokens_per_s": tokens / duration}


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32, help="mean prompt length (tokens)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-gpu-blocks", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (A B, B A, ...); "
                   "the best of each mode is compared, as other load on the machine only "
                   "slows a run down")
    p.add_argument("--json", metavar="OUT", help="also write every number as JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from stepserve.model.presets import resolve_model

    vocab = json.loads((resolve_model(args.model) / "config.json").read_text())["vocab_size"]
    jobs = make_jobs(args.requests, args.prompt_len, args.max_tokens, vocab, args.seed)
    port = free_port()
    proc = start_server(args, port)  # loads while this process loads its own engine
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        engine = load_engine(args)
        asyncio.run(wait_healthy(url, proc))
        for k in range(args.rounds):
            order = ("in", "http") if k % 2 == 0 else ("http", "in")
            for mode in order:
                row = run_in_process(engine, args, jobs) if mode == "in" else \
                    asyncio.run(http_closed_loop(url, args.model, jobs, args.concurrency))
                row["round"] = k
                rows.append(row)
                print(f"round {k}: {row['mode']:<15} {row['tokens_per_s']:9.1f} tok/s",
                      file=sys.stderr)
    finally:
        stop_server(proc)
    best = {m: max(r["tokens_per_s"] for r in rows if r["mode"] == m)
            for m in ("in-process", "http-streaming")}
    ratio = best["http-streaming"] / best["in-process"]

    print(f"\nmodel {args.model}, {args.requests} requests, {args.concurrency} concurrent, "
          f"prompt ~{args.prompt_len} tokens, {args.max_tokens} output tokens each, "
          f"{args.rounds} rounds\n")
    print(f"{'round':>5}  {'mode':<16}{'requests':>9}{'out tokens':>12}{'seconds':>9}"
          f"{'tok/s':>9}")
    for r in rows:
        print(f"{r['round']:>5}  {r['mode']:<16}{r['requests']:>9}{r['output_tokens']:>12}"
              f"{r['duration_s']:>9.2f}{r['tokens_per_s']:>9.1f}")
    print(f"\nbest HTTP streaming / best in-process: {best['http-streaming']:.1f} / "
          f"{best['in-process']:.1f} tok/s = {ratio:.1%} (goal >= 90%)")
    if args.json:
        out = Path(args.json)
        out.write_text(json.dumps({"args": vars(args), "rows": rows, "best": best,
                                   "ratio": ratio}, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
