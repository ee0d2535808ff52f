"""Prompts that share a prefix with one computed in this very step wait one step for it.

A block enters the prefix cache once the step that computes it completes (kv_cache.py),
so a burst of prompts sharing a system prompt, all admitted in one step, would each
compute the shared part. Instead, a waiting prompt whose next uncached block is one this
step already computes for another request is left for the next step, where it finds the
block cached (SGLang defers such prompts in the same way). It costs that prompt one step
of waiting and saves computing the shared part again; an LLM.generate of 32 prompts
sharing 48 tokens computes 560 prompt tokens instead of 2048. Skipping a prompt is only
ever an optimisation: correctness never depends on it.
"""

from __future__ import annotations

from stepserve.core.output import SchedulerOutput
from stepserve.core.prefix_hash import BlockHash, BlockNamer
from stepserve.core.request import Request


class InFlightBlocks:
    """The names of the full blocks one step's prefill chunks compute, gathered from the
    step's batch when first asked and kept up to date as the batch grows."""

    def __init__(self, out: SchedulerOutput, block_size: int, namer: BlockNamer) -> None:
        self.out = out
        self.block_size = block_size
        self.namer = namer
        self.names: set[BlockHash] = set()
        self.seen = 0  # entries of out.requests gathered so far

    def holds_next_block_of(self, req: Request, num_hits: int) -> bool:
        """Whether the block after `req`'s `num_hits` cached ones, one it could take from
        the cache rather than compute (not its last), is being computed this step."""
        bs = self.block_size
        if (num_hits + 1) * bs >= req.num_tokens or num_hits >= len(req.block_hashes):
            return False
        self._gather()
        return req.block_hashes[num_hits] in self.names

    def _gather(self) -> None:
        out, bs = self.out, self.block_size
        requests, counts = out.requests, out.num_scheduled_tokens
        for req, n in zip(requests[self.seen:], counts[self.seen:]):
            if n > 1:  # a prefill chunk (a decode fills no block another prompt starts with)
                start = req.num_computed_tokens
                lo, hi = start // bs, (start + n) // bs
                if hi > lo:
                    self.names.update(self.namer.names(req, hi, bs)[lo:hi])
        self.seen = len(requests)
