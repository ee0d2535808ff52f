"""`stepserve plan speedup | capacity | models`: the incidents' arithmetic, each number
printed with how it was computed (`as_json`: the result dataclass). A bad value prints
`error: ...` and returns 2; counts and sizes are bounded by limits.py."""

from __future__ import annotations

import json
from dataclasses import asdict

from stepserve.config import limits
from stepserve.config.errors import UsageError, report_error
from stepserve.config.sizes import format_size, parse_size
from stepserve.plan.capacity import CapacityResult, capacity
from stepserve.plan.model_specs import get_model_spec, list_model_specs
from stepserve.plan.speedup import SpeedupResult, parse_group, speedup


def _checked_groups(texts: tuple[str, ...]) -> list[tuple[int, int]]:
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


def run_speedup(groups: tuple[str, ...], concurrency: int, order: str = "given",
                as_json: bool = False) -> int:
    """`groups` as COUNTxLENGTH ("10x2000"), `concurrency` slots per static batch,
    `order` how requests fill the batches (speedup.ORDERS)."""
    try:
        result = speedup(_checked_groups(groups), concurrency, order)
    except ValueError as exc:
        return report_error(exc)
    print(json.dumps(asdict(result), indent=2) if as_json else format_speedup(result))
    return 0


def run_capacity(kv_memory: str, max_len: int, peak_concurrency: int, *,
                 kv_bytes_per_token: str | None = None, model_spec: str | None = None,
                 headroom: float = 0.15, as_json: bool = False) -> int:
    """Sizes as text ("38GB", "192KiB"); KV bytes per token either given or derived from
    a model preset (`model_spec`)."""
    try:
        kv_memory_bytes = _checked_size("--kv-memory", kv_memory, limits.MAX_KV_BYTES)
        if model_spec is not None:
            spec = get_model_spec(model_spec)
            per_token = spec.kv_bytes_per_token
            source = (f"{spec.name}: 2 (K,V) x {spec.num_layers} layers x {spec.num_kv_heads} "
                      f"kv heads x {spec.head_dim} head_dim x {spec.dtype_bytes} bytes")
        elif kv_bytes_per_token is not None:
            spec = None
            per_token = _checked_size("--kv-bytes-per-token", kv_bytes_per_token,
                                      limits.MAX_KV_BYTES_PER_TOKEN)
            source = "given (--kv-bytes-per-token)"
        else:
            raise UsageError("give --kv-bytes-per-token SIZE or --model-spec NAME")
        result = capacity(kv_memory_bytes, per_token, max_len, headroom, peak_concurrency)
    except ValueError as exc:
        return report_error(exc)
    if as_json:
        print(json.dumps({**asdict(result), "model_spec": spec and spec.name}, indent=2))
    else:
        print(format_capacity(result, source))
    return 0


def run_model_specs(as_json: bool = False) -> int:
    specs = list_model_specs()
    if as_json:
        rows = [dict(vars(s), kv_bytes_per_token=s.kv_bytes_per_token) for s in specs]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<14} {'params':>8} {'layers':>6} {'heads':>5} {'kv':>3} {'head_dim':>8}"
          f" {'KV/token':>10}")
    for s in specs:
        print(f"{s.name:<14} {s.num_params / 1e9:>7.2f}B {s.num_layers:>6} {s.num_heads:>5}"
              f" {s.num_kv_heads:>3} {s.head_dim:>8} {format_size(s.kv_bytes_per_token):>10}")
    print("KV/token = 2 (K,V) x layers x kv heads x head_dim x 2 bytes (bf16)")
    return 0


def _filled(r: SpeedupResult) -> str:
    """How requests filled the static batches, in words."""
    return "longest first" if r.fill_order == "longest-first" else "in the order given"


def _batch_rows(r: SpeedupResult) -> list[str]:
    lines = ["", f"static batches, filled {_filled(r)}:",
             f"  {'batch':<13} {'requests':>8} {'steps':>8} {'useful':>10} {'slot util':>9}"]
    for b in r.batches:
        last = b.first_batch + b.num_batches - 1
        name = f"{b.first_batch}" if b.num_batches == 1 else f"{b.first_batch}-{last}"
        lines.append(f"  {name:<13} {b.num_requests:>8,} {b.steps:>8,} "
                     f"{b.useful_tokens:>10,} {b.slot_utilization:>9.1%}")
    return lines


def _order_rows(r: SpeedupResult) -> list[str]:
    """Where more than one batch makes the order matter: the range over every order."""
    if not r.order_sensitive:
        return []
    return [
        _row("static, any order", f"{r.static_steps_min:,}-{r.static_steps_max:,}",
             f"longest first .. the {r.num_batches:,} longest requests one per batch"),
        _row("cap, any order", f"{r.speedup_cap_min:.2f}-{r.speedup_cap_max:.2f}x",
             f"slot utilisation {r.slot_utilization_max:.1%} .. {r.slot_utilization_min:.1%}"),
        f"note: {r.num_requests:,} requests need {r.num_batches:,} static batches of "
        f"{r.concurrency}, so the arrival order changes static steps and the cap; the "
        "figures above are for the order "
        + ("given (--group order)" if r.fill_order == "given" else "longest first")
        + "; quote the range, or fix an order with --order",
    ]


def format_speedup(r: SpeedupResult) -> str:
    mix = " + ".join(f"{count}x{length}" for count, length in r.groups)
    c = r.concurrency
    lines = [
        f"static vs. continuous batching: {r.num_requests:,} requests ({mix}) at concurrency {c}",
        _row("static steps", f"{r.static_steps:,}",
             f"sum over {r.num_batches:,} static batch(es), filled {_filled(r)}, of its "
             "longest request"),
        _row("useful tokens", f"{r.useful_tokens:,}", f"{mix} output tokens"),
        _row("slot utilisation", f"{r.slot_utilization:.1%}",
             f"{r.useful_tokens:,} useful / ({c} slots x {r.static_steps:,} static steps)"),
        _row("ideal steps", f"{r.ideal_steps:,.1f}",
             f"{r.useful_tokens:,} useful / {c} slots: every slot refilled at once, no idling"),
        _row("speedup cap", f"{r.speedup_cap:.2f}x",
             f"{r.static_steps:,} static / {r.ideal_steps:,.1f} ideal steps (= 1 / slot util)"),
        _row("longest request", f"{r.longest_request_steps:,}",
             "no single run ends sooner; the cap is for sustained load, drain ignored"),
        *_order_rows(r),
    ]
    if r.num_batches > 1:
        lines += _batch_rows(r)
    last_batch = r.batches[-1]
    if last_batch.num_requests < c:
        lines.append(f"note: the last batch fills {last_batch.num_requests} of {c} slots; "
                     "its empty slots count as idle")
    if r.slot_utilization_min < 0.5 <= r.slot_utilization_max:
        lines.append(
            f"verdict: slot utilisation {r.slot_utilization_min:.1%}-"
            f"{r.slot_utilization_max:.1%} depending on the order: continuous batching "
            f"can gain {r.speedup_cap_min:.2f}x-{r.speedup_cap_max:.2f}x at most")
    elif r.slot_utilization < 0.5:
        lines.append("verdict: slot utilisation below 50%: continuous batching has room for "
                     "more than 2x")
    else:
        lines.append("verdict: slot utilisation at or above 50%: continuous batching can "
                     "gain at most 2x, before its scheduling overhead")
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
        _row("seqs per replica", f"{r.seqs_per_replica:,}",
             f"floor({kv} / {per_seq}) = floor({exact:,.2f}): the KV limit"),
        _row("max_num_seqs", f"{r.max_num_seqs:,}",
             f"floor({exact:,.2f} x {keep:g}) = floor({exact * keep:,.2f}): keeps "
             f"{r.headroom:.0%} of KV free"),
        _row("replicas", f"{r.replicas:,}",
             f"ceil({r.peak_concurrency:,} peak / {r.seqs_per_replica:,} seqs per replica): "
             "fewest whose KV holds the peak"),
        _row("queued at peak", f"{r.queued_at_peak:,}",
             f"max(0, {r.peak_concurrency:,} - {r.replicas} x {r.max_num_seqs:,}): waiting at "
             "peak; size max_waiting for it"),
        _row("replicas, no queue", f"{r.replicas_within_headroom:,}",
             f"ceil({r.peak_concurrency:,} / {r.max_num_seqs:,}): the whole peak runs at once"),
    ]
    return "\n".join(lines)


def _row(name: str, value: str, how: str) -> str:
    return f"  {name:<18} {value:>11}   {how}"
