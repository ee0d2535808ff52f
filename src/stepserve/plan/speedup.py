"""How much continuous batching can gain over static batching for a length mix: the
night-report incident's arithmetic (docs/guide.md), exact.

* A static batch of `concurrency` slots, filled in arrival order (or longest first),
  holds its slots until its longest member ends: `static_steps` sums those lengths.
* With several batches the order matters (20x2000 + 108x20 at 64: 2,020 steps with the
  longs together, 4,000 one per batch), so the range over every order is given too:
  fewest longest first, most with the ceil(n / c) longest one per batch.
* Slot utilisation = useful tokens / (concurrency x static steps), a partial last
  batch's empty slots idle. Ideal steps = useful tokens / concurrency (every freed slot
  refilled at once, drain ignored: 9x20 + 1x2000 at 10 slots still takes 2,000 steps,
  `longest_request_steps`, while its cap is ~9x). Speedup cap = 1 / slot utilisation.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from stepserve.config.validate import Allowed

Group = tuple[int, int]  # (number of requests, output length in tokens/steps)
ORDERS = ("given", "longest-first")  # how requests fill the static batches
Composition = tuple[Group, ...]  # one batch: runs of (count, length), adjacent lengths distinct

_GROUP_RE = re.compile(r"^\s*(\d+)\s*[xX\u00d7*]\s*(\d+)\s*$")
POSITIVE = Allowed(1)


@dataclass(frozen=True)
class BatchStats:
    """One static batch, or a run of identical consecutive batches."""

    first_batch: int  # 0-based index of the first batch of the run
    num_batches: int  # how many identical consecutive batches this row stands for
    num_requests: int  # requests in each batch (<= concurrency)
    steps: int  # steps each batch takes: its longest member
    useful_tokens: int  # output tokens each batch produces
    slot_utilization: float  # useful_tokens / (concurrency x steps), in (0, 1]


@dataclass(frozen=True)
class SpeedupResult:
    """Static batching vs. ideal continuous batching for one workload."""

    groups: tuple[Group, ...]  # the workload as given: (count, length) in order
    concurrency: int  # slots per batch
    num_requests: int
    num_batches: int  # static batches, the last possibly partial
    useful_tokens: int  # total output tokens
    static_steps: int  # sum over static batches of the longest member
    ideal_steps: float  # useful_tokens / concurrency: every slot busy every step
    slot_utilization: float  # useful_tokens / (concurrency x static_steps), in (0, 1]
    speedup_cap: float  # static_steps / ideal_steps (= 1 / slot_utilization), >= 1
    idle_slot_steps: int  # concurrency x static_steps - useful_tokens
    longest_request_steps: int  # no finite run of this workload finishes faster
    batches: tuple[BatchStats, ...]  # per-batch breakdown, identical neighbours merged
    fill_order: str  # the order requests filled the batches above (ORDERS)
    # over every arrival order of the same requests (equal to the above for one batch)
    order_sensitive: bool
    static_steps_min: int  # longest first
    static_steps_max: int  # the ceil(n / c) longest one per batch
    speedup_cap_min: float
    speedup_cap_max: float
    slot_utilization_min: float
    slot_utilization_max: float


def parse_group(text: str) -> Group:
    """`"10x2000"` -> (10, 2000): COUNT requests of LENGTH output tokens each."""
    match = _GROUP_RE.match(text)
    if match is None:
        raise ValueError(
            f"cannot read group {text!r}: expected COUNTxLENGTH with whole numbers, "
            "e.g. 10x2000 for 10 requests of 2000 output tokens"
        )
    count, length = int(match.group(1)), int(match.group(2))
    _check_group(count, length, text)
    return count, length


def speedup(groups: Sequence[Group], concurrency: int,
            order: str = "given") -> SpeedupResult:
    """Static vs. ideal continuous batching for `groups` of (count, length) at
    `concurrency`, the batches filled in `order` (ORDERS), with the range over every
    order."""
    if not groups:
        raise ValueError("no groups: need at least one COUNTxLENGTH group of requests")
    for group in groups:
        if not isinstance(group, (tuple, list)) or len(group) != 2:
            raise ValueError(f"group {group!r}: expected a (count, length) pair")
        _check_group(group[0], group[1], tuple(group))
    groups = tuple((count, length) for count, length in groups)
    POSITIVE.check("concurrency", concurrency, ValueError)
    Allowed(kind=str, choices=ORDERS).check("order", order, ValueError)
    longest_first = _longest_first(groups)
    rows, static_steps, useful_tokens, num_batches = _static(
        longest_first if order == "longest-first" else groups, concurrency)
    fewest = _static(longest_first, concurrency)[1]
    most = _spread_steps(longest_first, num_batches)

    slot_steps = concurrency * static_steps
    return SpeedupResult(
        groups=groups, concurrency=concurrency, num_requests=sum(c for c, _ in groups),
        num_batches=num_batches, useful_tokens=useful_tokens, static_steps=static_steps,
        ideal_steps=useful_tokens / concurrency, slot_utilization=useful_tokens / slot_steps,
        # one division of exact integers, so equal lengths give exactly 1.0
        speedup_cap=slot_steps / useful_tokens, idle_slot_steps=slot_steps - useful_tokens,
        longest_request_steps=max(length for _, length in groups), batches=tuple(rows),
        fill_order=order, order_sensitive=fewest != most, static_steps_min=fewest,
        static_steps_max=most, speedup_cap_min=concurrency * fewest / useful_tokens,
        speedup_cap_max=concurrency * most / useful_tokens,
        slot_utilization_min=useful_tokens / (concurrency * most),
        slot_utilization_max=useful_tokens / (concurrency * fewest))


def _static(groups: Sequence[Group], concurrency: int
            ) -> tuple[list[BatchStats], int, int, int]:
    """The batches filled in the order of `groups`: (rows, static steps, useful tokens,
    number of batches)."""
    rows: list[BatchStats] = []
    static_steps = useful_tokens = num_batches = 0
    # identical consecutive batches merged, so the breakdown stays short
    for composition, run in groupby(_batches(groups, concurrency), key=lambda b: b[0]):
        repeat = sum(n for _, n in run)
        steps = max(length for _, length in composition)
        useful = sum(count * length for count, length in composition)
        rows.append(BatchStats(
            first_batch=num_batches, num_batches=repeat,
            num_requests=sum(count for count, _ in composition), steps=steps,
            useful_tokens=useful, slot_utilization=useful / (concurrency * steps)))
        static_steps += repeat * steps
        useful_tokens += repeat * useful
        num_batches += repeat
    return rows, static_steps, useful_tokens, num_batches


def _longest_first(groups: Sequence[Group]) -> tuple[Group, ...]:
    """The same requests, longest first, equal lengths merged."""
    merged: Counter[int] = Counter()
    for count, length in groups:
        merged[length] += count
    return tuple((merged[length], length) for length in sorted(merged, reverse=True))


def _spread_steps(longest_first: Sequence[Group], num_batches: int) -> int:
    """Static steps with the `num_batches` longest requests one per batch: their sum."""
    total, left = 0, num_batches
    for count, length in longest_first:
        take = min(count, left)
        total += take * length
        left -= take
        if not left:
            break
    return total


def speedup_for_lengths(lengths: Sequence[int], concurrency: int) -> SpeedupResult:
    """`speedup` for a stream of output lengths, batched `concurrency` at a time in order:
    its static steps are what a static-batching simulation of it should take."""
    if not lengths:
        raise ValueError("lengths is empty: need at least one request")
    return speedup([(len(list(run)), n) for n, run in groupby(lengths)], concurrency)


def _check_group(count: Any, length: Any, where: object) -> None:
    for name, value in (("count", count), ("length", length)):
        if problem := POSITIVE.problem(name, value):
            raise ValueError(f"group {where!r}: {problem} (a group is COUNTxLENGTH, "
                             "e.g. 10x2000)")


def _batches(groups: Sequence[Group], concurrency: int) -> Iterator[tuple[Composition, int]]:
    """Fill batches in order; yields (composition, repeat) without expanding requests."""
    current: list[Group] = []
    room = concurrency
    for count, length in groups:
        left = count
        while left:
            if room == concurrency and left >= concurrency:
                # Whole batches of one length: emit them in one go (counts may be huge).
                repeat = left // concurrency
                yield ((concurrency, length),), repeat
                left -= repeat * concurrency
                continue
            take = min(room, left)
            if current and current[-1][1] == length:
                current[-1] = (current[-1][0] + take, length)
            else:
                current.append((take, length))
            room -= take
            left -= take
            if room == 0:
                yield tuple(current), 1
                current, room = [], concurrency
    if current:
        yield tuple(current), 1

