"""Prefix caching on the real server: the same shared-prefix load with caching on and off.

One server at a time, each started cold: `stepserve serve` with prefix caching (the
default), then with `--no-enable-prefix-caching`, and with `--llama-server PATH` llama.cpp's
server on the same GGUF (it keeps each slot's last prompt: its own prompt cache). Each is
driven by the same client, `stepserve bench --target URL`, on the same loads:

* shared-prefix at each `--concurrency` (default 8 and 32): vLLM's prefix_repetition
  dataset, `--num-prefixes` system prompts of `--prefix-len` tokens (8 of 1,000), each
  request one of them plus a `--suffix-len`-token user turn (100), `--output-len` answer
  tokens (64);
* control: random prompts of the same total length at the first concurrency: nothing to
  share, so caching can only cost (hashing blocks, looking them up).

Each load has its own seed, the same on every server (so each server sees the same
prompts, and no load reuses another's prefixes). Printed: output tok/s, TTFT P50/P99,
TPOT P50/P99 and the prefix-cache hit rate (from the responses' usage cached_tokens); then
on/off ratios. Goals: TTFT P50 at least 5x lower with caching on the shared-prefix loads;
at most 3% throughput lost on the control.

    python benchmarks/prefix_cache.py [--llama-server PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_vs_llamacpp import METRICS, Cell, Load, ratio, run_server  # noqa: E402

HIT = ("hit rate", "prefix_cache_hit_rate", 100.0)
COLUMNS = (*METRICS, HIT)
SERVERS = {"on": "caching on", "off": "caching off", "llama.cpp": "llama.cpp"}


def loads(args: argparse.Namespace) -> list[Load]:
    shared = ("--dataset-name", "prefix_repetition",
              "--prefix-repetition-prefix-len", str(args.prefix_len),
              "--prefix-repetition-suffix-len", str(args.suffix_len),
              "--prefix-repetition-num-prefixes", str(args.num_prefixes),
              "--prefix-repetition-output-len", str(args.output_len))
    out = [Load(f"shared c={c}", (*shared, "--num-prompts", str(args.num_prompts),
                                  "--max-concurrency", str(c), "--seed", str(seed)), c)
           for seed, c in enumerate(args.concurrency, start=1)]
    c = args.concurrency[0]
    out.append(Load(f"control c={c}", (
        "--dataset-name", "random", "--random-input-len", str(args.prefix_len + args.suffix_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(c), "--seed", str(len(out) + 1)), c))
    return out


def format_table(cells: list[Cell], load_names: list[str]) -> str:
    head = f"{'load':<16}{'server':<16}" + "".join(f"{m:>14}" for m, _, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for load in load_names:
        row = {c.server: c for c in cells if c.load == load}
        for server, cell in row.items():
            lines.append(f"{load:<16}{server:<16}" + "".join(
                f"{'-' if cell.summary.get(k) is None else f'{cell.summary[k] * s:.1f}':>14}"
                for _, k, s in COLUMNS))
        on = row.get("caching on")
        for other, label in (("caching off", "on / off"), ("llama.cpp", "on / llama.cpp")):
            if on and other in row:
                lines.append(f"{'':<16}{label:<16}" + "".join(
                    f"{ratio(on.summary.get(k), row[other].summary.get(k)):>14}"
                    for _, k, _ in METRICS))
    lines.append("latencies in ms, hit rate in %; ratios: throughput higher is better, "
                 "latencies lower is better")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                    default=[8, 32], help="comma-separated requests in flight")
    ap.add_argument("--num-prompts", type=int, default=64, help="requests per load")
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--suffix-len", type=int, default=100)
    ap.add_argument("--num-prefixes", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--llama-server", metavar="PATH", help="also llama.cpp's server")
    ap.add_argument("--slot-ctx", type=int, default=2048, help="llama-server context per slot")
    ap.add_argument("--port", type=int, default=8143)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--stepserve-args", default="", help="extra `stepserve serve` flags")
    ap.add_argument("--servers", default="on,off,llama.cpp",
                    help="which servers to run, comma-separated, of on (caching on), off "
                         "(caching off) and llama.cpp (needs --llama-server); default: all")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    chosen = args.servers.split(",")
    unknown = sorted(set(chosen) - set(SERVERS))
    if unknown or not chosen:
        print(f"error: --servers {args.servers!r}: unknown {', '.join(unknown)}; "
              f"allowed: {', '.join(SERVERS)}", file=sys.stderr)
        return 2
    if args.llama_server and not (Path(args.llama_server).is_file()
                                  and os.access(args.llama_server, os.X_OK)):
        print(f"error: --llama-server {args.llama_server}: not an executable file",
              file=sys.stderr)
        return 2
    todo = loads(args)
    serve = [sys.executable, "-m", "stepserve", "serve", "--model", args.model, "--host",
             "127.0.0.1", *args.stepserve_args.split()]
    servers = [(SERVERS[key], cmd, port) for key, cmd, port in (
        ("on", [*serve, "--port", str(args.port)], args.port),
        ("off", [*serve, "--port", str(args.port + 1), "--no-enable-prefix-caching"],
         args.port + 1)) if key in chosen]
    if args.llama_server and "llama.cpp" in chosen:
        from stepserve.model.gguf_convert import find_smollm2_gguf

        slots = max(args.concurrency)
        servers.append(("llama.cpp", [
            shutil.which(args.llama_server) or args.llama_server, "-m", str(find_smollm2_gguf()),
            "--host", "127.0.0.1", "--port", str(args.port + 2), "--parallel", str(slots),
            "--ctx-size", str(slots * args.slot_ctx), "--threads", str(os.cpu_count() or 1)],
            args.port + 2))
    print(f"load before starting: {os.getloadavg()[0]:.2f} (measure on a quiet machine)")
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        for name, cmd, port in servers:
            cells += run_server(name, cmd, port, todo, Path(tmp_name), args.ready_timeout,
                                keys=[k for _, k, _ in COLUMNS])
    print("")
    print(format_table(cells, [load.name for load in todo]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]),
            "loads": [asdict(load) for load in todo], "cells": [asdict(c) for c in cells]},
            indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
