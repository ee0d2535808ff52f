"""Shared prefixes: a class whose requests open with one of its `shared_prefixes` system
prompts of `prefix_len` tokens, then their own `prompt` tokens. A prefix is named
`<class>/<k>`; the same name always gives the same token ids and two names never share
their first token, so prompts share KV blocks exactly when they share a prefix.
"""

from __future__ import annotations

import hashlib

from stepserve.config.limits import MAX_LEN
from stepserve.workload.errors import WorkloadError, check_int

# Enough for thousands of tenants with a few prompts each; the router's index and the
# prefix cache bound their own memory, this bounds what a workload file can ask for.
MAX_SHARED_PREFIXES = 100_000
# The first token of a prefix: far above the simulator's per-request ids (1 << 20 plus
# the request's index), 40 bits of the name's SHA-256 beneath it.
PREFIX_ID_BASE = 1 << 41


def check_shared_prefixes(count: int, length: int) -> None:
    """`shared_prefixes` and `prefix_len`: both 0 (none), or both given."""
    check_int("shared_prefixes", count, lo=0, hi=MAX_SHARED_PREFIXES)
    check_int("prefix_len", length, lo=0, hi=MAX_LEN - 1)
    if (count == 0) != (length == 0):
        raise WorkloadError(f"shared_prefixes = {count}, prefix_len = {length}: give both "
                            f"(shared_prefixes in [1, {MAX_SHARED_PREFIXES}], prefix_len "
                            f"in [1, {MAX_LEN - 1}]) or neither")


def prefix_name(class_name: str, k: int) -> str:
    return f"{class_name}/{k}"


def prefix_token_ids(name: str, length: int) -> list[int]:
    """The token ids of the prefix `name`: a first token of its own, then filler."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    return [PREFIX_ID_BASE + int.from_bytes(digest[:5], "big")] + [2] * (length - 1)
