"""The same load through the real server, alone and beside competing work.

A CPU server shares its cores with whatever else the machine runs. This runs `stepserve
serve` (and, with `--llama-server PATH`, llama.cpp's server on the same GGUF), one server
at a time and each started once, under every condition of benchmarks/contention_loads.py
in turn: quiet, one busy loop at normal priority, the same at nice 19, and a two-job
compile-like load (CPU bursts and fsynced writes). Before measuring, a warm-up request;
each condition's load starts `--lead` seconds before its bench run, so it is in full
swing, and is killed when the run ends.

The client is `stepserve bench --target URL` (streaming /v1/completions, token-id prompts,
EOS ignored), as in benchmarks/engine_vs_llamacpp.py, whose helpers this reuses: by
default 48 requests of 64 prompt and 32 output tokens, 8 in flight. Every run draws its
prompts from its own seed (1, 2, ... in the order of the runs; the warm-up 0), since
llama-server serves a prompt it has seen from a slot's cache (see engine_vs_llamacpp.py).

The table, per concurrency: output tok/s, TTFT P50/P99, TPOT P50/P99 of each server under
each condition, its ratio to the same server's quiet run, and with llama.cpp the
stepserve / llama.cpp ratio under the same condition. `uptime` is printed at the start
(a warning when the 1-minute load is above 0.5: measure on a quiet machine) and recorded
before every run in `--json`.

    python benchmarks/contention.py [--llama-server PATH] [--stepserve-args="--threads 1"]
        [--json OUT]
    python benchmarks/contention.py --quick     # the tiny random-weight model, a tiny load
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from contention_loads import Condition, conditions
from contention_table import Run, format_tables
from engine_vs_llamacpp import Load, bench, stop, wait_ready

from stepserve.cli.parser import Parser
from stepserve.config.errors import UsageError, report_error
from stepserve.config.limits import (
    CONCURRENCY,
    MAX_LEN,
    MAX_SECONDS,
    REQUESTS,
    Range,
    check_flags,
)
from stepserve.config.user_files import check_output_file, write_atomic

# (flag dest, the measured case's value, --quick's value): --quick runs the tiny model in
# seconds, as a smoke test of the whole path
LOAD_DEFAULTS = (("concurrency", [8], [2]), ("num_prompts", 48, 4), ("input_len", 64, 8),
                 ("output_len", 32, 4), ("lead", 3.0, 0.5))
# the tiny model's server as the server tests run it: a small KV pool starts in seconds
QUICK_SERVE_FLAGS = ("--num-gpu-blocks", "512", "--max-model-len", "256",
                     "--max-num-seqs", "64")
# the 1-minute load average above which the machine is not quiet (a process busy a
# second in two)
QUIET_LOAD = 0.5
RANGES = {"num_prompts": REQUESTS, "input_len": Range(1, MAX_LEN),
          "output_len": Range(1, MAX_LEN), "lead": Range(0, 600, float),
          "port": Range(1, 65534), "ready_timeout": Range(1, MAX_SECONDS, float),
          "slot_ctx": Range(1, MAX_LEN), "threads": Range(1, 4096)}


@dataclass(frozen=True)
class Server:
    name: str
    cmd: tuple[str, ...]
    port: int


def uptime() -> str:
    """`uptime`'s line (the load averages from the kernel where it is not installed)."""
    if shutil.which("uptime"):
        done = subprocess.run(["uptime"], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


@contextmanager
def running(server: Server, tmp: Path, ready_timeout_s: float) -> Iterator[str]:
    """The server started, its URL once it answers; stopped on the way out."""
    url = f"http://127.0.0.1:{server.port}"
    log_path = tmp / f"{server.name}.log"
    print(f"{server.name}: {' '.join(server.cmd)}", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server.cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_ready(url, proc, ready_timeout_s)
            except RuntimeError:
                sys.stderr.write(log_path.read_text()[-4000:])
                raise
            yield url
        finally:
            stop(proc)


def load_for(args, concurrency: int, seed: int, num_prompts: int | None = None) -> Load:
    return Load(f"c={concurrency}", (
        "--random-input-len", str(args.input_len), "--random-output-len",
        str(args.output_len), "--num-prompts", str(num_prompts or args.num_prompts),
        "--max-concurrency", str(concurrency), "--seed", str(seed)), concurrency)


def measure(server: Server, todo: list[Condition], args, tmp: Path) -> list[Run]:
    """Every condition at every concurrency on one start of `server`."""
    runs: list[Run] = []
    with running(server, tmp, args.ready_timeout) as url:
        bench(url, load_for(args, 1, 0, num_prompts=1), tmp / f"{server.name}-warm-up.json")
        seed = 0
        for condition in todo:
            for c in args.concurrency:
                seed += 1
                before = uptime()
                t0 = time.perf_counter()
                with condition.start() as started:
                    time.sleep(args.lead)  # the load in full swing before the first request
                    summary = bench(url, load_for(args, c, seed),
                                    tmp / f"{server.name}-{condition.name}-{c}.json")
                    if gone := started.exited():
                        raise RuntimeError(f"the {condition.name} load's processes {gone} "
                                           "stopped during the run: it ran lighter than named")
                runs.append(Run(server.name, condition.name, c, seed, before,
                                list(os.getloadavg()), summary, time.perf_counter() - t0))
                print(f"  {condition.name:<12} c={c:<4} "
                      f"{summary.get('throughput_tokens_per_s') or 0:8.1f} tok/s", flush=True)
    return runs


def _concurrencies(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be comma-separated integers, "
                                         "e.g. 1,8,32") from None


def build_parser() -> Parser:
    ap = Parser(prog="contention.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny random-weight model and "
                    "a tiny load (2 in flight, 4 requests of 8 + 4 tokens): a smoke test")
    ap.add_argument("--model", help="what `stepserve serve` loads (default: default; "
                    "--quick: tiny)")
    ap.add_argument("--stepserve-args", default="", help="extra `stepserve serve` flags, "
                    "e.g. \"--threads 1\"")
    ap.add_argument("--llama-server", metavar="PATH", help="also run llama.cpp's server "
                    "binary on the same GGUF (default: stepserve alone)")
    ap.add_argument("--gguf", help="the GGUF llama-server serves (default: the default "
                    "model's)")
    ap.add_argument("--llama-args", default="", help="extra llama-server flags")
    ap.add_argument("--threads", type=int, help="llama-server --threads (default: torch's "
                    "thread count)")
    ap.add_argument("--slot-ctx", type=int, default=512, help="llama-server context per slot")
    ap.add_argument("--conditions", default=",".join(c.name for c in conditions()),
                    help="comma-separated conditions to run, in order (ratios need quiet)")
    ap.add_argument("--scratch-dir", help="where the compile load writes (default: the "
                    "system's temp folder)")
    ap.add_argument("--concurrency", type=_concurrencies, help="comma-separated requests "
                    "in flight, each a run (default: 8; --quick: 2)")
    ap.add_argument("--num-prompts", type=int, help="requests a run (default: 48; --quick: 4)")
    ap.add_argument("--input-len", type=int, help="prompt tokens (default: 64; --quick: 8)")
    ap.add_argument("--output-len", type=int, help="output tokens (default: 32; --quick: 4)")
    ap.add_argument("--lead", type=float, help="seconds a condition's load runs before its "
                    "bench starts (default: 3; --quick: 0.5)")
    ap.add_argument("--port", type=int, default=8133, help="stepserve's port; llama-server "
                    "gets the next")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--json", metavar="OUT", help="everything: commands, conditions, "
                    "`uptime` before each run, results")
    return ap


def parse(argv: list[str] | None) -> tuple[object, list[Condition]]:
    """The flags, checked, with the load's defaults filled in; the conditions to run."""
    args = build_parser().parse_args(argv)
    for dest, measured, quick in LOAD_DEFAULTS:
        if getattr(args, dest) is None:
            setattr(args, dest, quick if args.quick else measured)
    check_flags(args, RANGES)
    for c in args.concurrency:
        CONCURRENCY.check("--concurrency", c)
    known = {c.name: c for c in conditions(args.scratch_dir)}
    names = args.conditions.split(",")
    if bad := [n for n in names if n not in known]:
        raise UsageError(f"--conditions: no condition {bad[0]!r}; allowed: "
                         f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise UsageError(f"--conditions {args.conditions!r}: a condition named twice")
    if args.scratch_dir and not Path(args.scratch_dir).is_dir():
        raise UsageError(f"--scratch-dir {args.scratch_dir!r}: is not a folder")
    if args.llama_server and not (Path(args.llama_server).is_file()
                                  and os.access(args.llama_server, os.X_OK)):
        raise UsageError(f"--llama-server {args.llama_server!r}: is not an executable file")
    if args.quick and args.llama_server and not args.gguf:
        raise UsageError("--quick serves the tiny random-weight model, which has no GGUF: "
                         "with --llama-server, pass --gguf")
    check_output_file("--json", args.json)
    return args, [known[n] for n in names]


def servers(args) -> tuple[list[Server], str | None]:
    """stepserve, then llama.cpp's server if asked for; the GGUF it serves."""
    model = args.model or ("tiny" if args.quick else "default")
    ours = (sys.executable, "-m", "stepserve", "serve", "--model", model, "--host",
            "127.0.0.1", "--port", str(args.port), "--log-level", "warning",
            *(QUICK_SERVE_FLAGS if args.quick else ()), *args.stepserve_args.split())
    out = [Server("stepserve", ours, args.port)]
    if not args.llama_server:
        return out, None
    import torch

    from stepserve.model.gguf_convert import find_smollm2_gguf

    gguf = args.gguf or str(find_smollm2_gguf())
    slots = max(args.concurrency)
    llama = (args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port",
             str(args.port + 1), "--parallel", str(slots), "--ctx-size",
             str(slots * args.slot_ctx), "--threads",
             str(args.threads or torch.get_num_threads()), *args.llama_args.split())
    return [*out, Server("llama.cpp", llama, args.port + 1)], gguf


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM too unwinds through every load's cleanup


def main(argv: list[str] | None = None) -> int:
    try:
        args, todo = parse(argv)
    except UsageError as e:
        return report_error(e)
    signal.signal(signal.SIGTERM, _interrupted)
    start = uptime()
    print(start)
    if os.getloadavg()[0] > QUIET_LOAD:
        print(f"warning: the 1-minute load is {os.getloadavg()[0]:.2f} (above {QUIET_LOAD}): "
              "other work is running, and every condition is measured on top of it; "
              "measure on a quiet machine", file=sys.stderr)
    todo_servers, gguf = servers(args)
    runs: list[Run] = []
    try:
        with tempfile.TemporaryDirectory(prefix="stepserve-contention-") as tmp:
            for server in todo_servers:
                runs += measure(server, todo, args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted: every load and server stopped, nothing written", file=sys.stderr)
        return 130  # a shell's status for a command ended by SIGINT
    print("")
    print(format_tables(runs))
    if args.json:
        write_atomic(args.json, json.dumps({
            "command": " ".join(["python", *sys.argv]), "uptime_at_start": start,
            "gguf": gguf, "servers": {s.name: list(s.cmd) for s in todo_servers},
            "conditions": [{"name": c.name, "what": c.what} for c in todo],
            "load": {"concurrency": args.concurrency, "num_prompts": args.num_prompts,
                     "input_len": args.input_len, "output_len": args.output_len,
                     "lead_s": args.lead},
            "runs": [asdict(r) for r in runs]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
