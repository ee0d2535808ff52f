"""The prompt a Mooncake trace's request sends (workload/mooncake.py): block by block, each
from its hash id's seed, so prompts share text (and, on the server, tokens) exactly as far
as their hash ids agree.

Token ids: the trace's own ids in the vocabulary. Text with a tokenizer: each block text
that encodes to its token count (a cut last block: the same draws, fewer tokens); the
tokens at a seam between blocks may merge, so a shared prefix is shared up to the seam
where two prompts part. Without one: a word a token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stepserve.bench.prompt_maker import WORDS, exact_text
from stepserve.metrics.request_metrics import cacheable_tokens
from stepserve.workload.mooncake import TraceSpec, prompt_blocks, trace_token_ids

if TYPE_CHECKING:
    from stepserve.model.tokenizer import Tokenizer

# Fitted block texts kept for reuse: a trace repeats its hash ids (that is its point),
# and fitting one is a few encode/decode rounds. Bounded: a long trace has millions.
MAX_CACHED_BLOCKS = 100_000


class TracePrompts:
    """Prompts of trace requests, the fitted text of each (seed, tokens) block kept."""

    def __init__(self) -> None:
        self._texts: dict[tuple[str, int], str] = {}

    def token_ids(self, spec: TraceSpec, vocab: int) -> list[int]:
        return trace_token_ids(spec, vocab)

    def text(self, spec: TraceSpec, tokenizer: Tokenizer | None) -> str:
        if tokenizer is None:
            return " ".join(_words(seed, n) for seed, n in prompt_blocks(spec))
        return " ".join(self._fitted(tokenizer, seed, n) for seed, n in prompt_blocks(spec))

    def _fitted(self, tokenizer: Tokenizer, seed: str, n: int) -> str:
        text = self._texts.get((seed, n))
        if text is None:
            text = exact_text(tokenizer, n, random.Random(seed))
            if len(self._texts) >= MAX_CACHED_BLOCKS:
                self._texts.pop(next(iter(self._texts)))  # the oldest
            self._texts[(seed, n)] = text
        return text


def _words(seed: str, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def repeated_trace_tokens(specs: Sequence[TraceSpec]) -> list[int]:
    """For each request, the leading prompt tokens an earlier one began with, from the
    hash ids alone (the prompts share exactly their common hash-id prefix, a cut last
    block as far as both have it), in the whole blocks a cache could give."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node: the prefixes
    covered: list[int] = [0]  # per node, the most tokens an earlier prompt had along it
    out = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: specs[i].arrival_s):
        s = specs[i]
        node, shared, path = 0, 0, []
        for depth, h in enumerate(s.hash_ids, start=1):
            child = nodes.get((node, h))
            if child is None:
                child = nodes[(node, h)] = len(covered)
                covered.append(0)
            elif shared == (depth - 1) * s.block_tokens:  # still on an earlier prompt
                shared = covered[child]
            node = child
            path.append((child, min(s.prompt_len, depth * s.block_tokens)))
        out[i] = cacheable_tokens(min(shared, s.prompt_len), s.prompt_len)
        for child, tokens in path:
            covered[child] = max(covered[child], tokens)
    return out
