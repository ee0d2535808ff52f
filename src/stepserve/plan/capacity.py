"""How many sequences one replica's KV cache holds, and how many replicas a peak needs,
by the worst case (the promo-spike incident's arithmetic): every sequence may reach
`max_len`, since sizing by the mean lets long requests set off preemption storms.
max_num_seqs keeps `headroom` free, floored once on the exact quotient (47.19 x 0.85 =
40.11 -> 40; twice would give 39); what the replicas cannot admit at once waits
(`queued_at_peak`: what `max_waiting` must absorb).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from stepserve.config.sizes import format_size
from stepserve.config.validate import Allowed

POSITIVE = Allowed(1)
HEADROOM = Allowed(0, 1, float, hi_open=True, note=", e.g. 0.15 keeps 15% free")


@dataclass(frozen=True)
class CapacityResult:
    """KV capacity of one replica and the replica count for a peak."""

    kv_memory_bytes: int  # KV cache memory per replica
    kv_bytes_per_token: int  # K and V over all layers for one token
    max_len: int  # longest sequence (prompt + output) a request may reach
    headroom: float  # share of KV memory kept free, in [0, 1)
    peak_concurrency: int  # concurrent requests at peak
    tokens_capacity: int  # floor(kv_memory / kv_bytes_per_token)
    bytes_per_seq: int  # max_len x kv_bytes_per_token
    seqs_per_replica: int  # floor(kv_memory / bytes_per_seq): the hard KV limit
    max_num_seqs: int  # floor(kv_memory x (1 - headroom) / bytes_per_seq)
    replicas: int  # ceil(peak_concurrency / seqs_per_replica)
    queued_at_peak: int  # max(0, peak - replicas x max_num_seqs): waiting at peak
    replicas_within_headroom: int  # ceil(peak_concurrency / max_num_seqs)


def capacity(kv_memory_bytes: int, kv_bytes_per_token: int, max_len: int, headroom: float,
             peak_concurrency: int) -> CapacityResult:
    """Size one replica's concurrency from its KV memory, and the replicas for a peak."""
    for name, value in (("kv_memory_bytes", kv_memory_bytes),
                        ("kv_bytes_per_token", kv_bytes_per_token), ("max_len", max_len),
                        ("peak_concurrency", peak_concurrency)):
        POSITIVE.check(name, value, ValueError)
    HEADROOM.check("headroom", headroom, ValueError)
    # 1 - headroom as an exact fraction of the decimal the user wrote (0.1 is 1/10)
    keep = 1 - Fraction(repr(float(headroom)))

    bytes_per_seq = max_len * kv_bytes_per_token
    seqs_per_replica = kv_memory_bytes // bytes_per_seq
    if seqs_per_replica == 0:
        raise ValueError(
            f"one sequence of max_len {max_len} needs {format_size(bytes_per_seq)} of KV "
            f"({max_len} x {format_size(kv_bytes_per_token)} per token) but kv_memory is "
            f"{format_size(kv_memory_bytes)}: no sequence fits; lower max_len or add KV memory"
        )
    max_num_seqs = math.floor(kv_memory_bytes * keep / bytes_per_seq)
    if max_num_seqs == 0:
        raise ValueError(
            f"headroom {headroom} leaves {format_size(int(kv_memory_bytes * keep))} of KV, "
            f"less than one sequence of max_len {max_len} ({format_size(bytes_per_seq)}); "
            "lower headroom or max_len"
        )
    replicas = -(-peak_concurrency // seqs_per_replica)
    return CapacityResult(
        kv_memory_bytes=kv_memory_bytes, kv_bytes_per_token=kv_bytes_per_token,
        max_len=max_len, headroom=float(headroom), peak_concurrency=peak_concurrency,
        tokens_capacity=kv_memory_bytes // kv_bytes_per_token, bytes_per_seq=bytes_per_seq,
        seqs_per_replica=seqs_per_replica, max_num_seqs=max_num_seqs, replicas=replicas,
        queued_at_peak=max(0, peak_concurrency - replicas * max_num_seqs),
        replicas_within_headroom=-(-peak_concurrency // max_num_seqs))
