"""Soak test of the real server: thousands of streamed requests with client disconnects
and KV preemption, then checks that every request got exactly one answer, that no KV
block leaked, and that the server's memory did not grow.

`stepserve serve --model tiny` runs in a subprocess (its RSS is the server's own) with a
KV pool far smaller than the load needs, so requests are preempted all the time. After a
warm-up, `--requests` streamed requests go through the official `openai` async client,
`--concurrency` in flight: half /v1/completions, half /v1/chat/completions, max_tokens
from 1 to 192, and a `--disconnect-fraction` of them abandoned mid-stream (the stream
closed, or the task reading it cancelled). Each request has a `--deadline` (s); one with
no end by then is "hung". Outcomes are defined in soak_harness.py.

The server's own counters must account for every request: the increase of
stepserve:request_success (by finished_reason) plus stepserve:request_rejected equals the
number sent. (A hung request the deadline cancelled before the server read it is counted
by neither: with hung requests the totals may differ.) Goals: 0 lost, 0 hung, 0 KV
blocks in use once idle, every request counted by the server, and /health answering
200 within 1 s throughout (exit status 1 if one is missed); RSS growth < 5% is reported
beside them.

Hostile connections are held open beside the load all along, warm-up included (always;
0 turns them off): `--idle-connections` (1,000) that never send a byte, and `--slowloris`
(50) that send a request head a byte at a time, each opened again as soon as the server
closes it (benchmarks/hostile.py). /health is probed on a fresh connection every 0.25 s,
and its worst time is printed.

    python benchmarks/soak.py --json soak.json
    python benchmarks/soak.py --requests 200 --preemption-mode swap --num-cpu-blocks 256
    python benchmarks/soak.py --idle-connections 0 --slowloris 0   (the load alone)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hostile import HEALTH_GOAL_S, HostileClients, HostileReport
from soak_harness import (
    ABORTED,
    COMPLETED,
    ERROR,
    HUNG,
    LOST,
    OUTCOMES,
    REJECTED,
    Outcome,
    P,
    Samples,
    ServerProcess,
    ends_since,
    make_plans,
    metric,
    run_load,
    wait_idle,
)

RSS_GROWTH_GOAL = 0.05


@dataclass(frozen=True)
class SoakConfig:
    requests: int = 2000
    concurrency: int = 32
    disconnect_fraction: float = 0.1
    seed: int = 0
    deadline_s: float = 60.0  # a request with no end by then is hung
    warmup: int = 64  # requests (same mix, another seed) before RSS and counters are read
    idle_timeout_s: float = 30.0  # after the load, how long the server may take to go idle
    # the server: 32 sequences of ~9 blocks on average (up to 21) share 128, so it preempts
    num_gpu_blocks: int = 128
    max_num_seqs: int = 32
    max_model_len: int = 512
    preemption_mode: str = "recompute"
    num_cpu_blocks: int = 0  # swap preemption's CPU pool
    idle_connections: int = 1000  # held open beside the load, sending nothing
    slowloris: int = 50  # held open beside the load, sending a head a byte at a time
    header_timeout_s: float | None = None  # the server's --header-timeout (None: default)

    def serve_flags(self) -> list[str]:
        timeout = [] if self.header_timeout_s is None else \
            ["--header-timeout", f"{self.header_timeout_s:g}"]
        return ["--num-gpu-blocks", str(self.num_gpu_blocks), "--max-num-seqs",
                str(self.max_num_seqs), "--max-model-len", str(self.max_model_len),
                "--preemption-mode", self.preemption_mode,
                "--num-cpu-blocks", str(self.num_cpu_blocks), *timeout]


@dataclass
class SoakResult:
    sent: int
    outcomes: dict[str, int]  # client side: completed, aborted, rejected, error, hung, lost
    server_ended: dict[str, int]  # increase of request_success by finished_reason
    server_rejected: dict[str, int]  # increase of request_rejected by reason
    preemptions: int
    blocks_used_after: int
    running_after: int
    waiting_after: int
    swapped_after: int
    rss_before_kb: int
    rss_after_kb: int
    server_exit_status: int  # after SIGINT (a graceful shutdown): 0
    output_tokens: int
    duration_s: float
    hostile: HostileReport  # the connections held beside the load, and /health's times
    problems: list[str] = field(default_factory=list)  # the first few non-answers, verbatim

    @property
    def lost(self) -> int:
        return self.outcomes[LOST]

    @property
    def hung(self) -> int:
        return self.outcomes[HUNG]

    @property
    def server_total(self) -> int:
        return sum(self.server_ended.values()) + sum(self.server_rejected.values())

    @property
    def accounted(self) -> bool:
        """The server ended or rejected exactly the requests sent, and ended as complete at
        least those the client saw complete (a disconnect may come after the end)."""
        done = self.server_ended.get("stop", 0) + self.server_ended.get("length", 0)
        return self.server_total == self.sent and done >= self.outcomes[COMPLETED]

    @property
    def rss_growth(self) -> float:
        return self.rss_after_kb / self.rss_before_kb - 1.0

    def goals(self) -> dict[str, bool]:
        return {"0 lost": self.lost == 0, "0 hung": self.hung == 0,
                "0 leaked blocks": self.blocks_used_after == 0,
                "server counted every request": self.accounted,
                f"/health 200 within {HEALTH_GOAL_S:g} s": self.hostile.health_ok,
                f"RSS growth < {RSS_GROWTH_GOAL:.0%}": self.rss_growth < RSS_GROWTH_GOAL}

    @property
    def ok(self) -> bool:
        """The goals that fail the run (RSS is too noisy on short runs to be one)."""
        return all(met for goal, met in self.goals().items() if not goal.startswith("RSS"))


# ---- the run ----

def load(server: ServerProcess, config: SoakConfig, n: int, seed: int) -> list[Outcome]:
    plans = make_plans(n, config.disconnect_fraction, seed)
    return asyncio.run(run_load(server.url + "/v1", "tiny", plans, config.concurrency,
                                config.deadline_s))


def tally(outcomes: list[Outcome], sent: int) -> dict[str, int]:
    """Outcomes by kind; "lost" is what is left of `sent` (a request with no outcome at
    all counts there too)."""
    kinds = Counter(o.kind for o in outcomes)
    answered = {k: kinds[k] for k in OUTCOMES if k != LOST}
    return {**answered, LOST: sent - sum(answered.values())}


def server_side(base: Samples, after: Samples) -> dict:
    """SoakResult's fields read from the server's /metrics before and after the run."""
    ended, rejected = ends_since(base, after)

    def level(name: str) -> int:
        return round(metric(after, P + name))

    return dict(server_ended=ended, server_rejected=rejected,
                preemptions=level("num_preemptions_total")
                - round(metric(base, P + "num_preemptions_total")),
                blocks_used_after=level("num_gpu_blocks_used"),
                running_after=level("num_requests_running"),
                waiting_after=level("num_requests_waiting"),
                swapped_after=level("num_requests_swapped"))


def run_soak(config: SoakConfig) -> SoakResult:
    server = ServerProcess(config.serve_flags())
    try:
        server.wait_healthy()
        with HostileClients(server.url, config.idle_connections, config.slowloris) as hostile:
            load(server, config, config.warmup, config.seed + 1)
            base = wait_idle(server, server.samples(), 0, config.idle_timeout_s)
            rss_before = server.rss_kb()
            t0 = time.perf_counter()
            outcomes = load(server, config, config.requests, config.seed)
            duration = time.perf_counter() - t0
            after = wait_idle(server, base, config.requests, config.idle_timeout_s)
            rss_after = server.rss_kb()
    finally:
        exit_status = server.stop()
    return SoakResult(
        sent=config.requests, outcomes=tally(outcomes, config.requests),
        **server_side(base, after), rss_before_kb=rss_before, rss_after_kb=rss_after,
        server_exit_status=exit_status, duration_s=duration, hostile=hostile.report,
        output_tokens=sum(o.output_tokens for o in outcomes),
        problems=[o.detail for o in outcomes if o.detail][:10])


# ---- the report ----

def print_report(config: SoakConfig, r: SoakResult) -> None:
    c, ended = r.outcomes, r.server_ended
    rows = [
        ("sent", f"{r.sent:,}", ""),
        ("completed (stop or length)", f"{c[COMPLETED]:,}", ""),
        ("aborted (client disconnects)", f"{c[ABORTED]:,}", ""),
        ("rejected (4xx, 429)", f"{c[REJECTED]:,}", ""),
        ("errors (5xx, error event)", f"{c[ERROR]:,}", ""),
        (f"hung (no end in {config.deadline_s:g} s)", f"{r.hung:,}", "goal 0"),
        ("lost (no answer)", f"{r.lost:,}", "goal 0"),
        ("server: preemptions", f"{r.preemptions:,}", "> 0 wanted"),
        ("server after: KV blocks in use", f"{r.blocks_used_after}", "goal 0"),
        ("server after: running / waiting / swapped",
         f"{r.running_after} / {r.waiting_after} / {r.swapped_after}", ""),
        ("server RSS before (after warm-up)", f"{r.rss_before_kb / 1024:.1f} MiB", ""),
        ("server RSS after", f"{r.rss_after_kb / 1024:.1f} MiB",
         f"{r.rss_growth:+.2%} (goal < {RSS_GROWTH_GOAL:.0%})"),
        ("server exit status after SIGINT", f"{r.server_exit_status}", ""),
    ]
    print(f"\nstepserve serve --model tiny {' '.join(config.serve_flags())}")
    print(f"{config.concurrency} in flight, {config.disconnect_fraction:.0%} disconnect, seed "
          f"{config.seed}, {r.duration_s:.1f} s, {r.output_tokens:,} output tokens in "
          f"completed requests\n")
    for name, value, note in rows:
        print(f"{name:<42}{value:>16}  {note}")
    print("\nserver counters (increase over the run) against the client:")
    print(f"  stop + length {ended.get('stop', 0) + ended.get('length', 0):>7,}   "
          f"(stop {ended.get('stop', 0):,})  client completed {c[COMPLETED]:,} + disconnects "
          "that finished first")
    print(f"  abort         {ended.get('abort', 0):>7,}   client aborted {c[ABORTED]:,} + hung "
          f"{r.hung:,}, less disconnects that finished first")
    others = {k: v for k, v in ended.items() if k not in ("stop", "length", "abort")}
    print(f"  other ends    {sum(others.values()):>7,}   {others or ''} client errors "
          f"{c[ERROR]:,}")
    print(f"  rejected      {sum(r.server_rejected.values()):>7,}   {r.server_rejected or ''} "
          f"client rejected {c[REJECTED]:,}")
    print(f"  total         {r.server_total:>7,}   sent {r.sent:,}")
    for p in r.problems:
        print(f"  ! {p}")
    h = r.hostile
    print(f"\nbeside the load: {h.idle} idle connections ({h.idle_opened:,} opened, "
          f"{h.idle_closed:,} closed by the server), {h.slowloris} slowloris ("
          f"{h.slowloris_opened:,} opened, {h.slowloris_408:,} cut with 408), "
          f"{h.refused:,} refused")
    print(f"/health: {h.health_probes:,} probes, {h.health_failures} failed, worst "
          f"{h.health_max_s * 1000:.0f} ms, P99 {h.health_p99_s * 1000:.0f} ms "
          f"(goal < {HEALTH_GOAL_S * 1000:.0f} ms)")
    for p in h.problems:
        print(f"  ! {p}")
    print("\ngoals: " + ", ".join(f"{g} {'met' if ok else 'MISSED'}"
                                   for g, ok in r.goals().items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=SoakConfig.requests)
    p.add_argument("--concurrency", type=int, default=SoakConfig.concurrency)
    p.add_argument("--disconnect-fraction", type=float, default=SoakConfig.disconnect_fraction)
    p.add_argument("--seed", type=int, default=SoakConfig.seed)
    p.add_argument("--deadline", type=float, default=SoakConfig.deadline_s, metavar="S",
                   dest="deadline_s", help="a request with no end after this long is hung")
    p.add_argument("--warmup", type=int, default=SoakConfig.warmup,
                   help="requests before RSS and the counters are first read")
    for name in ("num_gpu_blocks", "max_num_seqs", "max_model_len", "num_cpu_blocks"):
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       default=getattr(SoakConfig, name), help="the server's setting")
    p.add_argument("--preemption-mode", default=SoakConfig.preemption_mode,
                   choices=["recompute", "swap"])
    p.add_argument("--idle-connections", type=int, default=SoakConfig.idle_connections,
                   help="connections held open beside the load, sending nothing (0: none)")
    p.add_argument("--slowloris", type=int, default=SoakConfig.slowloris,
                   help="connections held open beside the load, sending a request head "
                        "a byte at a time (0: none)")
    p.add_argument("--header-timeout", type=float, dest="header_timeout_s",
                   help="the server's --header-timeout (default: the server's)")
    p.add_argument("--json", metavar="OUT", help="also write every number as JSON")
    args = vars(p.parse_args(argv))
    out = args.pop("json")
    config = SoakConfig(**args)
    result = run_soak(config)
    print_report(config, result)
    if out:
        Path(out).write_text(json.dumps({"config": dataclasses.asdict(config),
                                         "result": dataclasses.asdict(result),
                                         "goals": result.goals()}, indent=2))
        print(f"wrote {out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
