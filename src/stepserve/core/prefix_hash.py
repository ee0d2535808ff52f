"""Names of full KV blocks for the prefix cache: a hash chain.

Block i is named hash(name of block i - 1, its token ids), block 0's parent the root, so
two blocks share a name only if the whole prefix up to their end and the `cache_salt`
agree. The algorithm (vLLM's `--prefix-caching-hash-algo`) changes only what a name
costs: builtin (default, Python's hash(), ~0.1 us a block) and xxhash (xxHash3-128) are
not collision resistant, but a salted request's names carry the salt itself, so no
collision crosses a salt; sha256 (~0.7 us a block) is collision resistant everywhere.
Each request names each of its blocks once (`Request.block_hashes`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from stepserve.config.settings import PREFIX_CACHING_HASH_ALGOS as HASH_ALGOS
from stepserve.core.request import Request

# An int (builtin, xxhash), (salt, int) for a salted request under those, or bytes (sha256).
BlockHash = int | tuple | bytes

DEFAULT_HASH_ALGO = HASH_ALGOS[0]

_DOMAIN = b"stepserve.prefix-cache.v1"
_ROOT = hashlib.sha256(_DOMAIN).digest()
# the first byte names the encoding: the two never collide
_INT64, _TEXT = b"q", b"t"


def _salt_digest(cache_salt: str) -> bytes:
    return hashlib.sha256(_DOMAIN + b"\x00salt\x00"
                          + cache_salt.encode("utf-8", "surrogatepass")).digest()


def _payload(token_ids: Sequence[int]) -> bytes:
    try:
        return _INT64 + array("q", token_ids).tobytes()
    except OverflowError:  # an id outside int64: no engine has one, but never crash on it
        return _TEXT + ",".join(map(str, token_ids)).encode()


class BlockNamer:
    """One algorithm's chain: `root(salt)`, then `name(parent, token_ids)` per block."""

    algo = ""

    def root(self, cache_salt: str | None) -> BlockHash:
        raise NotImplementedError

    def name(self, parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
        raise NotImplementedError

    def names(self, request: Request, num_blocks: int, block_size: int) -> list[BlockHash]:
        """`request.block_hashes`, extended over its first `num_blocks` (full) blocks; a
        name stays right once computed (tokens are only appended)."""
        hashes = request.block_hashes
        have = len(hashes)
        if have >= num_blocks:
            return hashes
        if num_blocks * block_size > request.num_tokens:
            raise ValueError(f"request {request.request_id}: block {num_blocks - 1} is not "
                             f"full ({request.num_tokens} tokens, block_size {block_size})")
        parent = hashes[-1] if have else self.root(request.cache_salt)
        prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
        # the prompt's blocks (most of them), then those reaching into the output
        in_prompt = min(num_blocks, num_prompt // block_size)
        if in_prompt > have:
            parent = self.chain(parent, prompt, have * block_size, in_prompt * block_size,
                                block_size, hashes)
        for i in range(len(hashes), num_blocks):
            parent = self.name(parent, block_tokens(request, i, block_size))
            hashes.append(parent)
        return hashes

    def chain(self, parent: BlockHash, token_ids: Sequence[int], lo: int, hi: int,
              block_size: int, out: list[BlockHash]) -> BlockHash:
        """Name the blocks of `token_ids[lo:hi]` after `parent` onto `out`; the last name."""
        name, append = self.name, out.append
        for start in range(lo, hi, block_size):
            parent = name(parent, token_ids[start:start + block_size])
            append(parent)
        return parent

    def prompt_names(self, token_ids: Sequence[int], cache_salt: str | None,
                     block_size: int, count: int | None = None) -> list[BlockHash]:
        """The names of the first `count` (default: every) full blocks of a prompt."""
        full = len(token_ids) // block_size
        out: list[BlockHash] = []
        self.chain(self.root(cache_salt), token_ids, 0,
                   (full if count is None else min(count, full)) * block_size, block_size, out)
        return out


class _Builtin(BlockNamer):
    algo = "builtin"
    # hash() of ints and int tuples is not randomised: the chain is reproducible
    _root = int.from_bytes(_ROOT[:8], "little")

    def root(self, cache_salt: str | None) -> BlockHash:
        if not cache_salt:
            return self._root
        return (cache_salt, int.from_bytes(_salt_digest(cache_salt)[:8], "little"))

    def name(self, parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
        if type(parent) is tuple:  # salted: the name carries the salt
            return (parent[0], hash((parent[1], *token_ids)))
        return hash((parent, *token_ids))

    def chain(self, parent: BlockHash, token_ids: Sequence[int], lo: int, hi: int,
              block_size: int, out: list[BlockHash]) -> BlockHash:
        if type(parent) is tuple:
            return super().chain(parent, token_ids, lo, hi, block_size, out)
        append = out.append  # the simulator's hottest naming loop: name() written out
        for start in range(lo, hi, block_size):
            parent = hash((parent, *token_ids[start:start + block_size]))
            append(parent)
        return parent


class _XXHash(BlockNamer):
    algo = "xxhash"

    def __init__(self) -> None:
        try:
            import xxhash
        except ImportError as e:  # pragma: no cover - xxhash is a dependency
            raise ValueError("prefix_caching_hash_algo = 'xxhash' needs the xxhash package "
                             "(pip install xxhash); or use builtin or sha256") from e
        self._digest: Callable[[bytes], int] = xxhash.xxh3_128_intdigest
        self._root = self._digest(_ROOT)

    def root(self, cache_salt: str | None) -> BlockHash:
        if not cache_salt:
            return self._root
        return (cache_salt, self._digest(_salt_digest(cache_salt)))

    def name(self, parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
        if type(parent) is tuple:
            salt, value = parent
            return (salt, self._digest(value.to_bytes(16, "little") + _payload(token_ids)))
        return self._digest(parent.to_bytes(16, "little") + _payload(token_ids))


class _SHA256(BlockNamer):
    algo = "sha256"

    def root(self, cache_salt: str | None) -> BlockHash:
        return _salt_digest(cache_salt) if cache_salt else _ROOT

    def name(self, parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
        return hashlib.sha256(parent + _payload(token_ids)).digest()


_NAMERS: dict[str, type[BlockNamer]] = {c.algo: c for c in (_Builtin, _XXHash, _SHA256)}
_made: dict[str, BlockNamer] = {}


def namer(algo: str = DEFAULT_HASH_ALGO) -> BlockNamer:
    """The block namer of `algo` (one of HASH_ALGOS)."""
    made = _made.get(algo)
    if made is None:
        cls = _NAMERS.get(algo)
        if cls is None:
            raise ValueError(f"prefix_caching_hash_algo = {algo!r}: must be one of "
                             f"{', '.join(HASH_ALGOS)}")
        made = _made[algo] = cls()
    return made


def block_tokens(request: Request, index: int, block_size: int) -> list[int]:
    """The token ids of block `index` of `request`, without concatenating it whole."""
    lo, hi = index * block_size, (index + 1) * block_size
    prompt, num_prompt = request.prompt_token_ids, request.num_prompt_tokens
    if hi <= num_prompt:
        return prompt[lo:hi]
    output = request.output_token_ids
    if lo >= num_prompt:
        return output[lo - num_prompt:hi - num_prompt]
    return prompt[lo:] + output[:hi - num_prompt]
