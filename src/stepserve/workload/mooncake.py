"""Mooncake traces (Kimi's public request traces, SGLang's `--dataset-name mooncake`): JSON
Lines, one request a line.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

`timestamp` is ms since the trace began; `hash_ids` names the prompt's blocks of
`block_tokens` (512 in Mooncake's traces), the last one partial: two requests whose
hash_ids share a prefix share those prompt blocks. Other keys are ignored.

Each request becomes a `TraceSpec`: it arrives at (timestamp - the first timestamp) / 1000
s times the slowdown (SGLang's `--mooncake-slowdown-factor`), asks for output_length tokens
and gets them, and its prompt's token ids follow its hash_ids (`trace_token_ids`): block
i's tokens drawn from a generator seeded by its hash id, so equal hash-id prefixes give
equal token prefixes. The trace's block size is independent of the engine's KV block
size. Prompt tokens past the last hash id (a trace may name fewer blocks than its prompt
has) are the request's own.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepserve.config.limits import MAX_LEN, MAX_SECONDS, MAX_SEED, MAX_WORKLOAD_TOKENS
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.workload.arrivals import TraceReplay
from stepserve.workload.errors import WorkloadError, check_int, check_positive, check_range
from stepserve.workload.spec import RequestSpec, Workload
from stepserve.workload.trace import load_trace, read_jsonl

MOONCAKE_BLOCK_TOKENS = 512  # the prompt tokens each hash id stands for in Mooncake's traces
REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")
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

    def token_ids(self, vocab: int = SIM_VOCAB) -> list[int]:
        return trace_token_ids(self, vocab)


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


def record_to_spec(record: Any, index: int, block_tokens: int) -> TraceSpec:
    """One decoded line as a spec (arrival_s still the raw timestamp, in s)."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{preview(record)}: must be a JSON object with keys "
                            f"{', '.join(REQUIRED)}")
    for key in REQUIRED:
        if key not in record:
            raise WorkloadError(f"missing required key {key!r} (a Mooncake line has "
                                f"{', '.join(REQUIRED)})")
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
            spec = record_to_spec(record, len(specs), block_tokens)
        except WorkloadError as e:
            raise WorkloadError(f"{at}: {e}") from None
        tokens += spec.prompt_len + spec.output_len
        if tokens > MAX_WORKLOAD_TOKENS:  # the simulator holds every token id
            raise WorkloadError(f"{at}: more than {MAX_WORKLOAD_TOKENS:,} "
                                "prompt and output tokens up to here (the most a workload "
                                "may hold)")
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


@dataclass(frozen=True)
class TraceOptions:
    """A JSON Lines trace to replay: `format` auto tells ours from Mooncake's by the first
    line's keys; `slowdown` stretches its times (2: half the rate); `block_tokens` is
    the prompt tokens of one Mooncake hash id."""

    path: str
    format: str = "auto"
    slowdown: float = 1.0
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def trace_workload(options: TraceOptions) -> Workload:
    """The trace as a workload on its own times; the reader's note (an out-of-order
    Mooncake file sorted) printed to stderr."""
    Allowed(choices=TRACE_FORMATS, kind=str).check("--trace-format", options.format,
                                                   WorkloadError)
    if options.format == "mooncake" or \
            (options.format == "auto" and is_mooncake_trace(options.path)):
        trace = load_mooncake_trace(options.path, options.slowdown, options.block_tokens)
        if trace.note:
            print(f"note: {trace.note}", file=sys.stderr)
        specs, path, description = trace.specs, trace.path, f"Mooncake trace {trace.path}"
    else:
        if options.block_tokens != MOONCAKE_BLOCK_TOKENS:
            raise WorkloadError(f"--trace-block-tokens {options.block_tokens}: goes with a "
                                "Mooncake trace (ours gives no block hashes)")
        slowdown = check_positive("--trace-slowdown", options.slowdown, hi=MAX_SLOWDOWN)
        specs = tuple(dataclasses.replace(s, arrival_s=s.arrival_s * slowdown)
                      for s in load_trace(options.path))
        path, description = str(options.path), f"trace {options.path}"
    return Workload(Path(options.path).stem, (), TraceReplay(specs, path),
                    len(specs), description=description)
