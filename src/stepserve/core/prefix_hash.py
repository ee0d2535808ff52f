"""Names of full KV blocks for the prefix cache: a hash chain.

Block i of a request is named hash(name of block i - 1, the block's token ids); block 0's
parent is the chain's root, which the request's `cache_salt` selects. Two blocks share a
name only if the whole token prefix up to their end is the same and so is the salt, so a
block's name says everything its KV depends on (one model, one block size: a KV manager
serves one engine). Requests with different salts never share a block: tenants that must
not learn about each other's prompts (by timing a cache hit) give different salts.

SHA-256 over a fixed encoding, not Python's hash(): the names are compared across
requests of different users, and a hash an attacker can steer into a collision would let
one prompt read another's KV (hash() of an int tuple is not keyed). A block costs about a
microsecond, and each request hashes each of its blocks once (`Request.block_hashes`
keeps them).
"""

from __future__ import annotations

import hashlib
from array import array

from stepserve.core.request import Request

BlockHash = bytes

_DOMAIN = b"stepserve.prefix-cache.v1"
_ROOT = hashlib.sha256(_DOMAIN).digest()
# The payload's first byte names its encoding, so the two encodings can never produce
# the same bytes for different token lists.
_INT64, _TEXT = b"q", b"t"


def chain_root(cache_salt: str | None) -> BlockHash:
    """The parent of a request's first block: one root per salt (no salt: the shared one)."""
    if not cache_salt:
        return _ROOT
    return hashlib.sha256(_DOMAIN + b"\x00salt\x00"
                          + cache_salt.encode("utf-8", "surrogatepass")).digest()


def block_hash(parent: BlockHash, token_ids: list[int]) -> BlockHash:
    """The name of a full block holding `token_ids` after the block named `parent`."""
    try:
        payload = _INT64 + array("q", token_ids).tobytes()
    except OverflowError:  # an id outside int64: no engine has one, but never crash on it
        payload = _TEXT + ",".join(map(str, token_ids)).encode()
    return hashlib.sha256(parent + payload).digest()


def block_tokens(request: Request, index: int, block_size: int) -> list[int]:
    """The token ids of block `index` of `request` (prompt, then output), without
    concatenating the whole sequence."""
    lo, hi = index * block_size, (index + 1) * block_size
    prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
    if hi <= num_prompt:
        return prompt[lo:hi]
    output = request.output_token_ids
    if lo >= num_prompt:
        return output[lo - num_prompt:hi - num_prompt]
    return prompt[lo:] + output[:hi - num_prompt]


def block_hashes(request: Request, num_blocks: int, block_size: int) -> list[BlockHash]:
    """`request.block_hashes`, extended to name at least its first `num_blocks` blocks
    (each must be full: num_blocks * block_size <= request.num_tokens). Tokens are only
    ever appended to a request, so a name, once computed, stays right."""
    hashes = request.block_hashes
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    if num_blocks * block_size > request.num_tokens:
        raise ValueError(f"request {request.request_id}: block {num_blocks - 1} is not full "
                         f"({request.num_tokens} tokens, block_size {block_size})")
    parent = hashes[-1] if have else chain_root(request.cache_salt)
    for i in range(have, num_blocks):
        parent = block_hash(parent, block_tokens(request, i, block_size))
        hashes.append(parent)
    return hashes
