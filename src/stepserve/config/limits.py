"""The bounds on every count, size, rate and time a user can give. `--max-num-seqs 1e15`
is a typo, found out unbounded only when memory runs out; each bound is far above any
real use and far below what would exhaust a machine."""

from __future__ import annotations

from collections.abc import Mapping

from stepserve.config.validate import Allowed

# requests in one workload, run or plan: a month of a busy service's traffic in a
# simulator that keeps every request in memory
MAX_NUM_REQUESTS = 1_000_000
# tokens in one prompt or one output, and max_model_len: 2^20, the longest contexts
# models offer today
MAX_LEN = 1 << 20
# expected prompt + output tokens of a whole workload: the simulator holds a token id
# (8 bytes) for each, so this is about 2 GB
MAX_WORKLOAD_TOKENS = 250_000_000
MAX_CONCURRENCY = 100_000  # requests in flight in a closed loop (concurrent users in a plan)
# arrival rates, requests per second: one a fortnight to a million a second
MIN_RATE = 1e-6
MAX_RATE = 1e6
# gamma burstiness (the shape): outside this the gaps are all-or-nothing
MIN_BURSTINESS = 1e-3
MAX_BURSTINESS = 1e3
# relative weights (class shares, mixture weights): normalised, so only ratios matter;
# a ratio over 10^9 is a typo, and sums of larger ones overflow a float
MAX_WEIGHT = 1e9
MAX_SECONDS = 30 * 86_400  # durations, windows, timeouts and waits, seconds: 30 days
MAX_SEED = 2**63 - 1  # workload seeds: a non-negative int64, as OpenAI's seed
MAX_NUM_SEQS = 65_536  # sequences in one step (max_num_seqs): beyond any accelerator's batch
MAX_BATCHED_TOKENS = 1 << 24  # tokens in one step: 16 max-length prompts at once
MAX_BLOCKS = 1 << 24  # KV blocks in a pool (device or CPU): the free list is 8 bytes a block
# bytes of KV cache for one replica, and KV bytes per token: 2 TiB (a node of eight
# 141 GB GPUs holds 1.1 TB) and 64 MiB (the largest models hold ~1 MiB a token)
MAX_KV_BYTES = 1 << 41
MAX_KV_BYTES_PER_TOKEN = 1 << 26
MAX_REPLICAS = 1024  # engine replicas behind one router
MAX_THREADS = 1024  # CPU threads of one engine's step (the largest CPU servers have 512 cores)
MAX_FILE_BYTES = 2 << 30  # a user file read whole (results, workloads): ShareGPT is ~0.7 GB
# a file read line by line (traces): lines of any kind, blank ones too (twice the requests
# a workload may have), and the bytes of one line or one item of a JSON list read item by
# item (a Mooncake line of 2^20 block ids is ~20 MB; a ShareGPT conversation a few KB)
MAX_FILE_LINES = 2 * MAX_NUM_REQUESTS
MAX_LINE_BYTES = 64 << 20
# a request head (request line and headers) the HTTP server reads: 16 MiB, 16x Go's
# default, 1,024x Node's (the heads of real clients are well under 8 KiB)
MAX_HEADER_BYTES = 16 << 20


# the values one numeric flag allows, both ends included; `inf_ok` for flags where inf
# means something (--request-rate inf: everything at once)
Range = Allowed


def check_flags(args: object, ranges: Mapping[str, Range]) -> None:
    """Check each flag given (not None) against its range; `ranges` is keyed by dest
    ("num_prompts" for --num-prompts), read off parsed flags or same-named options."""
    for dest, allowed in ranges.items():
        value = getattr(args, dest, None)
        if value is not None:
            allowed.check("--" + dest.replace("_", "-"), value)


# ranges shared by several commands' flags
REQUESTS = Range(1, MAX_NUM_REQUESTS)
RATE = Range(MIN_RATE, MAX_RATE, float)
SEED = Range(0, MAX_SEED)
CONCURRENCY = Range(1, MAX_CONCURRENCY)
SECONDS = Range(1e-3, MAX_SECONDS, float)
WAIT_SECONDS = Range(0.0, MAX_SECONDS, float)  # a wait where 0 means "none at all"
LENGTH = Range(1, MAX_LEN)
STEP_MS = Range(1e-3, 60_000.0, float)  # a constant cost model's step: 1 us to a minute
