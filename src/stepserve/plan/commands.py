"""`stepserve plan speedup | capacity | models`: the seed's arithmetic on the command line.

Every number printed comes with one line saying how it was computed. `--json` prints the
result dataclass as JSON instead. Handlers return an exit code; a bad value prints
`error: ...` to stderr and returns 2. Counts and sizes are bounded by limits.py: the
arithmetic would take them, but a request count of 10^15 is a typo.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepserve import limits
from stepserve.cli_errors import UsageError, report_error, reports_usage_errors
from stepserve.limits import Range, check_flags
from stepserve.plan.capacity import CapacityResult, capacity
from stepserve.plan.model_specs import get_model_spec, list_model_specs
from stepserve.plan.sizes import format_size, parse_size
from stepserve.plan.speedup import SpeedupResult, parse_group, speedup

# Bounds of the numeric flags: --concurrency is a static batch's slots (max_num_seqs).
PLAN_FLAGS = {"concurrency": Range(1, limits.MAX_NUM_SEQS), "max_len": limits.LENGTH,
              "peak_concurrency": Range(1, limits.MAX_NUM_REQUESTS)}


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `plan` and its subcommands to a parent's `add_subparsers()` object."""
    plan = subparsers.add_parser(
        "plan",
        help="capacity and speedup arithmetic (no model, no simulation)",
        description="Back-of-the-envelope planning: the seed's worked arithmetic, exact.",
    )
    sub = plan.add_subparsers(dest="plan_command", metavar="{speedup,capacity,models}")
    sub.required = True

    p = sub.add_parser(
        "speedup",
        help="slot utilisation of static batching and the continuous-batching cap",
        description="Static batching runs each batch until its longest request ends; "
        "requests fill batches of --concurrency in the order given.",
    )
    p.add_argument(
        "--group",
        action="append",
        required=True,
        metavar="COUNTxLENGTH",
        help="COUNT requests of LENGTH output tokens, e.g. 10x2000; repeatable",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        required=True,
        metavar="N",
        help="slots per static batch (max_num_seqs)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_speedup)

    p = sub.add_parser(
        "capacity",
        help="sequences per replica from KV memory, max_num_seqs, replicas",
        description="Sizes concurrency by the worst case: every sequence may reach --max-len.",
    )
    p.add_argument(
        "--kv-memory",
        required=True,
        metavar="SIZE",
        help="KV cache memory per replica, e.g. 38GB or 35GiB",
    )
    per_token = p.add_mutually_exclusive_group(required=True)
    per_token.add_argument(
        "--kv-bytes-per-token",
        metavar="SIZE",
        help="KV bytes per token over all layers, e.g. 192KiB",
    )
    per_token.add_argument(
        "--model-spec",
        metavar="NAME",
        help="derive KV bytes per token from a preset (see `plan models`)",
    )
    p.add_argument(
        "--max-len",
        type=int,
        required=True,
        metavar="N",
        help="longest sequence (prompt + output) in tokens, i.e. max_model_len",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=0.15,
        metavar="F",
        help="share of KV memory kept free when setting max_num_seqs (default 0.15)",
    )
    p.add_argument(
        "--peak-concurrency",
        type=int,
        required=True,
        metavar="N",
        help="concurrent requests at peak",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_capacity)

    p = sub.add_parser("models", help="list the model spec presets")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.set_defaults(func=run_models)
    return plan


def _checked_groups(texts: list[str]) -> list[tuple[int, int]]:
    groups = [parse_group(text) for text in texts]
    total, longest = sum(c for c, _ in groups), max(n for _, n in groups)
    if total > limits.MAX_NUM_REQUESTS or longest > limits.MAX_LEN:
        raise UsageError(f"--group: {total:,} requests, the longest {longest:,} tokens; at most "
                         f"{limits.MAX_NUM_REQUESTS:,} requests of {limits.MAX_LEN:,} tokens")
    return groups


def _checked_size(flag: str, text: str, most: int) -> int:
    size = parse_size(text)
    if size > most:
        raise UsageError(f"{flag} {text!r}: {size:,} bytes; at most {format_size(most)}")
    return size


@reports_usage_errors
def run_speedup(args: argparse.Namespace) -> int:
    check_flags(args, PLAN_FLAGS)
    try:
        groups = _checked_groups(args.group)
        result = speedup(groups, args.concurrency)
    except ValueError as exc:
        return report_error(exc)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_speedup(result))
    return 0


@reports_usage_errors
def run_capacity(args: argparse.Namespace) -> int:
    check_flags(args, PLAN_FLAGS)
    try:
        kv_memory = _checked_size("--kv-memory", args.kv_memory, limits.MAX_KV_BYTES)
        if args.model_spec is not None:
            spec = get_model_spec(args.model_spec)
            per_token = spec.kv_bytes_per_token
            source = (
                f"{spec.name}: 2 (K,V) x {spec.num_layers} layers x {spec.num_kv_heads} "
                f"kv heads x {spec.head_dim} head_dim x {spec.dtype_bytes} bytes"
            )
        else:
            spec = None
            per_token = _checked_size("--kv-bytes-per-token", args.kv_bytes_per_token,
                                      limits.MAX_KV_BYTES_PER_TOKEN)
            source = "given (--kv-bytes-per-token)"
        result = capacity(kv_memory, per_token, args.max_len, args.headroom, args.peak_concurrency)
    except ValueError as exc:
        return report_error(exc)
    if args.json:
        out = result.to_dict()
        out["model_spec"] = spec.name if spec else None
        print(json.dumps(out, indent=2))
    else:
        print(format_capacity(result, source))
    return 0


def run_models(args: argparse.Namespace) -> int:
    specs = list_model_specs()
    if args.json:
        rows = [dict(vars(s), kv_bytes_per_token=s.kv_bytes_per_token) for s in specs]
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'name':<14} {'params':>8} {'layers':>6} {'heads':>5} {'kv':>3} {'head_dim':>8}"
        f" {'KV/token':>10}"
    )
    for s in specs:
        print(
            f"{s.name:<14} {s.num_params / 1e9:>7.2f}B {s.num_layers:>6} {s.num_heads:>5}"
            f" {s.num_kv_heads:>3} {s.head_dim:>8} {format_size(s.kv_bytes_per_token):>10}"
        )
    print("KV/token = 2 (K,V) x layers x kv heads x head_dim x 2 bytes (bf16)")
    return 0


def format_speedup(r: SpeedupResult) -> str:
    mix = " + ".join(f"{count}x{length}" for count, length in r.groups)
    c = r.concurrency
    lines = [
        f"static vs. continuous batching: {r.num_requests:,} requests ({mix}) at concurrency {c}",
        _row(
            "static steps",
            f"{r.static_steps:,}",
            f"sum over {r.num_batches:,} static batch(es) of its longest request",
        ),
        _row("useful tokens", f"{r.useful_tokens:,}", f"{mix} output tokens"),
        _row(
            "slot utilisation",
            f"{r.slot_utilization:.1%}",
            f"{r.useful_tokens:,} useful / ({c} slots x {r.static_steps:,} static steps)",
        ),
        _row(
            "ideal steps",
            f"{r.ideal_steps:,.1f}",
            f"{r.useful_tokens:,} useful / {c} slots: every slot refilled at once, no idling",
        ),
        _row(
            "speedup cap",
            f"{r.speedup_cap:.2f}x",
            f"{r.static_steps:,} static / {r.ideal_steps:,.1f} ideal steps (= 1 / slot util)",
        ),
        _row(
            "longest request",
            f"{r.longest_request_steps:,}",
            "no single run ends sooner; the cap is for sustained load, drain ignored",
        ),
    ]
    if r.num_batches > 1:
        lines += [
            "",
            "static batches, filled in the order given:",
            f"  {'batch':<13} {'requests':>8} {'steps':>8} {'useful':>10} {'slot util':>9}",
        ]
        for b in r.batches:
            last = b.first_batch + b.num_batches - 1
            name = f"{b.first_batch}" if b.num_batches == 1 else f"{b.first_batch}-{last}"
            lines.append(
                f"  {name:<13} {b.num_requests:>8,} {b.steps:>8,} "
                f"{b.useful_tokens:>10,} {b.slot_utilization:>9.1%}"
            )
    last_batch = r.batches[-1]
    if last_batch.num_requests < c:
        lines.append(
            f"note: the last batch fills {last_batch.num_requests} of {c} slots; "
            "its empty slots count as idle"
        )
    if r.slot_utilization < 0.5:
        lines.append(
            "verdict: slot utilisation below 50%: continuous batching has room for more than 2x"
        )
    else:
        lines.append(
            "verdict: slot utilisation at or above 50%: continuous batching can "
            "gain at most 2x, before its scheduling overhead"
        )
    return "\n".join(lines)


def format_capacity(r: CapacityResult, source: str) -> str:
    kv, per_token = format_size(r.kv_memory_bytes), format_size(r.kv_bytes_per_token)
    per_seq = format_size(r.bytes_per_seq)
    exact = r.kv_memory_bytes / r.bytes_per_seq
    keep = 1 - r.headroom
    lines = [
        f"KV capacity: {kv} per replica, max_len {r.max_len:,}, headroom {r.headroom:.0%}, "
        f"peak {r.peak_concurrency:,} concurrent",
        _row("kv bytes/token", f"{per_token}", source),
        _row("tokens capacity", f"{r.tokens_capacity:,}", f"floor({kv} / {per_token})"),
        _row("bytes per seq", per_seq, f"max_len {r.max_len:,} x {per_token}"),
        _row(
            "seqs per replica",
            f"{r.seqs_per_replica:,}",
            f"floor({kv} / {per_seq}) = floor({exact:,.2f}): the KV limit",
        ),
        _row(
            "max_num_seqs",
            f"{r.max_num_seqs:,}",
            f"floor({exact:,.2f} x {keep:g}) = floor({exact * keep:,.2f}): keeps "
            f"{r.headroom:.0%} of KV free",
        ),
        _row(
            "replicas",
            f"{r.replicas:,}",
            f"ceil({r.peak_concurrency:,} peak / {r.seqs_per_replica:,} seqs per replica): "
            "fewest whose KV holds the peak",
        ),
        _row(
            "queued at peak",
            f"{r.queued_at_peak:,}",
            f"max(0, {r.peak_concurrency:,} - {r.replicas} x {r.max_num_seqs:,}): waiting at "
            "peak; size max_waiting for it",
        ),
        _row(
            "replicas, no queue",
            f"{r.replicas_within_headroom:,}",
            f"ceil({r.peak_concurrency:,} / {r.max_num_seqs:,}): the whole peak runs at once",
        ),
    ]
    return "\n".join(lines)


def _row(name: str, value: str, how: str) -> str:
    return f"  {name:<18} {value:>10}   {how}"
