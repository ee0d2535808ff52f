"""A workload's requests, `RequestSpec`s, engine-neutral: the simulator turns one into a
`Request` of `prompt_len` dummy tokens, the bench client into an HTTP call; `output_len` is
the truth the simulated model obeys, `max_tokens` all a real scheduler would see. And
traces of them as JSON Lines, one request a line (docs/guide.md tells both formats). Ours,
which `load_trace` reads back from `save_trace`:

    {"arrival_s": 0.0, "prompt_len": 312, "output_len": 87, "max_tokens": 87,
     "priority": 0, "tenant": "a", "class": "chat"}

and Mooncake's (`{"timestamp": ms, "input_length", "output_length", "hash_ids"}`, other
keys ignored), each line a `TraceSpec` whose prompt's token ids follow its hash ids
(`trace_token_ids`): each names one block of `block_tokens`, the last one partial, so
equal hash-id prefixes give equal token prefixes.
"""

from __future__ import annotations

import dataclasses
import json
import random
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepserve.config.limits import (
    MAX_LEN,
    MAX_NUM_REQUESTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_WORKLOAD_TOKENS,
)
from stepserve.config.user_files import preview, read_lines, write_atomic
from stepserve.core.request_limits import PRIORITY_MAX, PRIORITY_MIN, TENANT_MAX_CHARS
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_positive,
    check_range,
    check_str,
    read_user_items,
)
from stepserve.workload.sessions import MAX_THINK_S, MAX_TURNS


def check_priority_and_tenant(priority: Any, tenant: Any) -> None:
    """What a request's SamplingParams will accept (request_limits.py), checked here so
    a workload fails when it is read, not mid-run."""
    check_int("priority", priority, lo=PRIORITY_MIN, hi=PRIORITY_MAX)
    name = check_str("tenant", tenant)
    if len(name) > TENANT_MAX_CHARS:
        raise WorkloadError(f"tenant = {name[:40]!r}...: {len(name)} characters; at most "
                            f"{TENANT_MAX_CHARS}")


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. Invariant: 1 <= output_len <= max_tokens."""

    index: int
    arrival_s: float
    prompt_len: int
    output_len: int
    max_tokens: int
    priority: int = 0  # lower is more urgent, as in vLLM
    tenant: str = "default"
    request_class: str = "default"
    length_estimate: int | None = None
    prefix: str | None = None  # the shared prefix its prompt starts with (shared_prefix.py)
    prefix_len: int = 0  # that prefix's tokens, counted in prompt_len
    # a multi-turn session (sessions.py): its first turn's index, this turn's place in it,
    # the seconds after the previous turn's end it is sent, and the tokens of its prompt
    # that are the conversation so far (the previous prompt and its answer)
    session: int | None = None
    turn: int = 0
    think_time_s: float = 0.0
    history_len: int = 0

    def __post_init__(self) -> None:
        check_int("index", self.index, lo=0)
        object.__setattr__(self, "arrival_s",
                           check_positive("arrival_s", self.arrival_s, allow_zero=True))
        check_int("prompt_len", self.prompt_len, lo=1, hi=MAX_LEN)
        check_int("output_len", self.output_len, lo=1, hi=MAX_LEN)
        check_int("max_tokens", self.max_tokens, lo=1, hi=MAX_LEN)
        if self.output_len > self.max_tokens:
            raise WorkloadError(f"output_len = {self.output_len}: must be <= max_tokens = "
                                f"{self.max_tokens} (a request cannot outrun its cap)")
        check_priority_and_tenant(self.priority, self.tenant)
        check_str("class", self.request_class)
        if self.length_estimate is not None:
            check_int("length_estimate", self.length_estimate, lo=1, hi=MAX_LEN)
        if self.prefix is not None or self.prefix_len:
            check_str("prefix", self.prefix)
            check_int("prefix_len", self.prefix_len, lo=1, hi=self.prompt_len)
        if self.session is not None or self.turn:
            check_int("session", self.session, lo=0, hi=self.index)
            check_int("turn", self.turn, lo=0, hi=MAX_TURNS - 1)
            check_positive("think_time_s", self.think_time_s, allow_zero=True, hi=MAX_THINK_S)
            check_int("history_len", self.history_len, lo=0, hi=self.prompt_len - 1)


# a line's keys -> the RequestSpec fields they fill (the index is the line's place)
FIELDS = {"arrival_s": "arrival_s", "prompt_len": "prompt_len", "output_len": "output_len",
          "max_tokens": "max_tokens", "priority": "priority", "tenant": "tenant",
          "class": "request_class", "length_estimate": "length_estimate"}
REQUIRED = ("arrival_s", "prompt_len", "output_len")


def spec_to_record(spec: RequestSpec) -> dict[str, Any]:
    record = {key: getattr(spec, attr) for key, attr in FIELDS.items()}
    if spec.length_estimate is None:
        del record["length_estimate"]
    return record


def record_to_spec(record: Any, index: int) -> RequestSpec:
    """A spec from one decoded line; raises WorkloadError naming the bad field."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{preview(record)}: must be a JSON object with keys "
                            f"{', '.join(FIELDS)}")
    for key in record:
        if key not in FIELDS:
            raise WorkloadError(f"unknown key {preview(key)}; allowed keys: {', '.join(FIELDS)}")
    for key in REQUIRED:
        if key not in record:
            raise WorkloadError(f"missing required key {preview(key)}")
    check_positive("arrival_s", record["arrival_s"], allow_zero=True, hi=MAX_SECONDS)
    fields = {attr: record[key] for key, attr in FIELDS.items() if key in record}
    return RequestSpec(index=index, **{"max_tokens": record["output_len"], **fields})


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, Any]]:
    """The decoded records of a JSON Lines file of requests (`what`: "trace"), each
    parsed as it is read (user_files.read_lines: blank lines skipped but counted), with
    where it stands (`trace 'path' line N`) for an error about it; at most
    MAX_NUM_REQUESTS. WorkloadError for a file that cannot be read, a line that is not
    JSON, too many requests or none."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    count = 0
    for number, line in read_user_items(read_lines(p, what)):
        if not line.strip():
            continue
        if count == MAX_NUM_REQUESTS:
            raise WorkloadError(f"{where}: more than {MAX_NUM_REQUESTS:,} requests (the "
                                "most a workload may have)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where} line {number}: not valid JSON ({e.msg} at column "
                                f"{e.colno})") from None
        except (RecursionError, ValueError) as e:  # nested too deeply; a huge number
            raise WorkloadError(f"{where} line {number}: not valid JSON "
                                f"({type(e).__name__}: {e})") from None
        count += 1
        yield f"{where} line {number}", record
    if not count:
        raise WorkloadError(f"{where}: holds no requests")


def check_workload_tokens(tokens: int, at: str) -> None:
    """A trace's prompt and output tokens up to line `at` within what a workload may
    hold (the simulator holds every token id)."""
    if tokens > MAX_WORKLOAD_TOKENS:
        raise WorkloadError(f"{at}: more than {MAX_WORKLOAD_TOKENS:,} prompt and output "
                            "tokens up to here (the most a workload may hold)")


def load_trace(path: str | Path) -> list[RequestSpec]:
    """Read a JSONL trace. Blank lines are skipped; requests are sorted (stably) by
    arrival and re-indexed 0..n-1. Errors name the file and the line number."""
    specs = []
    tokens = 0
    for at, record in list(read_jsonl(path, "trace")):  # every line JSON before any check
        try:
            specs.append(record_to_spec(record, 0))
        except WorkloadError as e:
            raise WorkloadError(f"{at}: {e}") from None
        tokens += specs[-1].prompt_len + specs[-1].output_len
        check_workload_tokens(tokens, at)
    specs.sort(key=lambda s: s.arrival_s)
    return [dataclasses.replace(s, index=i) for i, s in enumerate(specs)]


def save_trace(specs: Iterable[RequestSpec], path: str | Path) -> Path:
    """Write specs as JSONL (in the order given; `load_trace` sorts by arrival)."""
    p = Path(path)
    lines = [json.dumps(spec_to_record(s)) for s in specs]
    write_atomic(p, "".join(line + "\n" for line in lines))
    return p


MOONCAKE_BLOCK_TOKENS = 512  # the prompt tokens each hash id stands for in Mooncake's traces
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
FIRST_ID = 10  # token ids below this are left alone: special tokens sit there
# The simulator's vocabulary: any ids do, a Llama-sized span keeps them plausible.
SIM_VOCAB = 32_000
MAX_SLOWDOWN = 1e6
# what detection reads before it gives up: a first request past these is no trace of ours
DETECT_LINES, DETECT_BYTES = 1000, 1 << 20


@dataclass(frozen=True)
class TraceSpec(RequestSpec):
    """A request whose prompt's identity is its blocks' hash ids."""

    hash_ids: tuple[int, ...] = ()
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def trace_token_ids(spec: TraceSpec, vocab: int = SIM_VOCAB) -> list[int]:
    """Exactly spec.prompt_len ids in [FIRST_ID, vocab): block i's from its hash id's
    generator (the last block cut), blocks past the hash ids from the request's index."""
    span = max(vocab - FIRST_ID, 2)
    ids: list[int] = []
    for seed, n in prompt_blocks(spec):
        # randbytes, not randrange per token: a long trace holds millions of tokens
        draws = array("H", random.Random(seed).randbytes(2 * n))
        ids += [FIRST_ID + d % span for d in draws]
    return ids


def prompt_blocks(spec: TraceSpec) -> list[tuple[str, int]]:
    """(seed, tokens) of each block of the prompt: a hash id's seed is the id's alone (a
    cut block is the start of the whole one), a block past the hash ids the request's."""
    out = []
    for i in range(-(-spec.prompt_len // spec.block_tokens)):
        n = min(spec.block_tokens, spec.prompt_len - i * spec.block_tokens)
        seed = f"mooncake/{spec.hash_ids[i]}" if i < len(spec.hash_ids) \
            else f"mooncake/own/{spec.index}/{i}"
        out.append((seed, n))
    return out


@dataclass(frozen=True)
class MooncakeTrace:
    specs: tuple[TraceSpec, ...]
    path: str
    note: str = ""  # what the reader changed (an out-of-order file sorted)


def mooncake_record_to_spec(record: Any, index: int, block_tokens: int) -> TraceSpec:
    """One decoded line as a spec (arrival_s still the raw timestamp, in s)."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{preview(record)}: must be a JSON object with keys "
                            f"{', '.join(MOONCAKE_KEYS)}")
    for key in MOONCAKE_KEYS:
        if key not in record:
            raise WorkloadError(f"missing required key {key!r} (a Mooncake line has "
                                f"{', '.join(MOONCAKE_KEYS)})")
    timestamp = check_range("timestamp", record["timestamp"], 0, MAX_SECONDS * 1000.0)
    input_length = check_int("input_length", record["input_length"], lo=1, hi=MAX_LEN)
    output_length = check_int("output_length", record["output_length"], lo=1, hi=MAX_LEN)
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list):
        raise WorkloadError(f"hash_ids = {preview(hash_ids)}: must be a list of integers")
    blocks = -(-input_length // block_tokens)
    if len(hash_ids) > blocks:
        raise WorkloadError(f"hash_ids = {preview(hash_ids)}: {len(hash_ids)} ids; at most "
                            f"{blocks} (input_length {input_length} in blocks of "
                            f"{block_tokens} tokens, the last partial)")
    for i, h in enumerate(hash_ids):
        check_int(f"hash_ids[{i}]", h, lo=0, hi=MAX_SEED)
    return TraceSpec(index=index, arrival_s=timestamp / 1000.0, prompt_len=input_length,
                     output_len=output_length, max_tokens=output_length,
                     request_class="mooncake", hash_ids=tuple(hash_ids),
                     block_tokens=block_tokens)


def load_mooncake_trace(path: str | Path, slowdown: float = 1.0,
                        block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> MooncakeTrace:
    """Read a Mooncake trace; WorkloadError naming the file and line on a bad one.
    Blank lines are skipped; requests are sorted (stably) by timestamp and indexed
    0..n-1, arrivals counted from the first."""
    slowdown = check_positive("--trace-slowdown", slowdown, hi=MAX_SLOWDOWN)
    block_tokens = check_int("--trace-block-tokens", block_tokens, lo=1, hi=MAX_LEN)
    p = Path(path)
    where = f"Mooncake trace {str(p)!r}"
    specs: list[TraceSpec] = []
    tokens = 0
    for at, record in read_jsonl(p, "Mooncake trace"):
        try:
            spec = mooncake_record_to_spec(record, len(specs), block_tokens)
        except WorkloadError as e:
            raise WorkloadError(f"{at}: {e}") from None
        tokens += spec.prompt_len + spec.output_len
        check_workload_tokens(tokens, at)
        specs.append(spec)
    in_order = all(a.arrival_s <= b.arrival_s for a, b in zip(specs, specs[1:]))
    note = "" if in_order else f"{where}: timestamps out of order; requests sorted by them"
    specs.sort(key=lambda s: s.arrival_s)
    start = specs[0].arrival_s
    return MooncakeTrace(tuple(dataclasses.replace(s, index=i, arrival_s=(s.arrival_s - start)
                                                   * slowdown)
                               for i, s in enumerate(specs)), str(p), note)


def is_mooncake_trace(path: str | Path) -> bool:
    """Whether a JSON Lines trace is Mooncake's: its first line has `input_length` (ours
    has `prompt_len`). A file that cannot be read or parsed is left to its reader."""
    try:
        with Path(path).open("rb") as f:
            for _ in range(DETECT_LINES):
                raw = f.readline(DETECT_BYTES)
                if not raw:
                    return False
                if raw.strip():
                    record = json.loads(raw)
                    return isinstance(record, dict) and "input_length" in record
    except (OSError, ValueError, RecursionError):
        return False
    return False


TRACE_FORMATS = ("auto", "stepserve", "mooncake")
