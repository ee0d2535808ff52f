"""lpm on the real server: a cold prompt behind hot traffic that never stops, with the
starvation guard off (`--aging-after-s 0`, the old default) and with the defaults.

`stepserve serve --model tiny --policy lpm --max-num-seqs 1`, one server at a time. Six
clients loop requests that share a `--prefix-len`-token prefix (unique 8-token suffixes,
`--output-len` tokens out) for `--hot-s` seconds; `--cold-at-s` in, one unrelated prompt
of the same length is streamed, and its time to first token is measured while the hot
load goes on. Without the guard the cold prompt waits for the hot load to stop; with it,
for about the guard's bound (`aging_after_s`, 10 s by default).

    python benchmarks/lpm_starvation.py [--hot-s 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_vs_llamacpp import stop, wait_ready  # noqa: E402

CLIENTS = 6
RUNS = {"guard off": ["--aging-after-s", "0"], "defaults": []}


def completion(client: httpx.Client, prompt: list[int], max_tokens: int) -> float:
    """Stream one completion; seconds from sending to its first token."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    return first if first is not None else float("nan")


def one_run(name: str, flags: list[str], args: argparse.Namespace, log: Path) -> dict:
    url = f"http://127.0.0.1:{args.port}"
    cmd = [sys.executable, "-m", "stepserve", "serve", "--model", "tiny", "--policy", "lpm",
           "--max-num-seqs", "1", "--port", str(args.port), *flags]
    print(f"{name}: {' '.join(cmd[2:])}", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc, 120)
            return drive(url, args)
        finally:
            stop(proc)


def drive(url: str, args: argparse.Namespace) -> dict:
    prefix = [10 + i % 400 for i in range(args.prefix_len)]
    suffixes = itertools.count()
    lock = threading.Lock()
    end = time.perf_counter() + args.hot_s
    hot_ttfts: list[float] = []

    def hot() -> None:
        with httpx.Client(base_url=url) as client:
            while time.perf_counter() < end:
                with lock:
                    n = next(suffixes)
                suffix = [10 + (n * 8 + k) % 400 for k in range(8)]
                hot_ttfts.append(completion(client, prefix + suffix, args.output_len))

    threads = [threading.Thread(target=hot) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(args.cold_at_s)
    cold_prompt = [450 + i % 60 for i in range(args.prefix_len + 8)]
    with httpx.Client(base_url=url) as client:
        sent = time.perf_counter()
        cold = completion(client, cold_prompt, args.output_len)
    hot_left = end - (sent + cold)
    for t in threads:
        t.join()
    hot_ttfts.sort()
    return {"cold_ttft_s": cold, "hot_load_left_s": hot_left, "hot_requests": len(hot_ttfts),
            "hot_ttft_p50_s": hot_ttfts[len(hot_ttfts) // 2] if hot_ttfts else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hot-s", type=float, default=40.0, help="how long the hot load runs")
    ap.add_argument("--cold-at-s", type=float, default=1.0)
    ap.add_argument("--prefix-len", type=int, default=360)
    ap.add_argument("--output-len", type=int, default=24)
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in RUNS.items():
            results[name] = one_run(name, flags, args, Path(tmp) / "server.log")
    print(f"\n{'run':<12}{'cold TTFT s':>13}{'hot load left s':>17}{'hot requests':>14}"
          f"{'hot TTFT P50 s':>16}")
    for name, r in results.items():
        print(f"{name:<12}{r['cold_ttft_s']:>13.2f}{r['hot_load_left_s']:>17.1f}"
              f"{r['hot_requests']:>14}{r['hot_ttft_p50_s'] or 0:>16.3f}")
    off, on = results["guard off"]["cold_ttft_s"], results["defaults"]["cold_ttft_s"]
    print(f"cold TTFT, guard off / defaults: {off / on:.1f}x (hot load left > 0: it was "
          "still running when the cold prompt's first token came)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
