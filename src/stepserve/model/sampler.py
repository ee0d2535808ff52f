"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds, one call for
the whole batch.

Random rows draw by inverse CDF (one uniform per row, `searchsorted` on the cumulative
probabilities) instead of `torch.multinomial` or an exponential race: on 2 CPU cores and
a [64, 49152] batch, multinomial took 72 ms, exponential noise 67 ms, softmax + cumsum +
searchsorted 5 ms. Top-k / top-p work on `topk` candidates rather than a full sort
(sort: 231 ms for the same batch, topk(256): 7 ms); a top-p row whose nucleus is not
inside the candidates falls back to a full sort of that row, so the result stays exact.

Seeds: a seeded request's draw for its k-th output token uses a generator seeded from
(seed, k). The same seed and prompt give the same text, independent of batch
composition, preemption or recompute, and the runner keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stepserve.request import SamplingParams

TOP_P_CANDIDATES = 256


def _row_uniforms(seeds: Sequence[int | None], indices: Sequence[int]) -> torch.Tensor:
    """One U[0, 1) per row: from a (seed, index) generator when seeded, else torch's RNG."""
    u = torch.rand(len(seeds), dtype=torch.float64)
    for r, (seed, index) in enumerate(zip(seeds, indices, strict=True)):
        if seed is not None:
            g = torch.Generator().manual_seed((seed * 0x9E3779B97F4A7C15 + index) % (1 << 63))
            u[r] = torch.rand(1, generator=g, dtype=torch.float64)[0]
    return u


def _draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column index per row, drawn from softmax(logits) by inverse CDF."""
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)
    target = (u.to(cdf.device, cdf.dtype) * cdf[:, -1])[:, None]
    # right=True: the first column whose cdf exceeds the target; masked (zero-probability)
    # columns never raise the cdf, so they are never picked.
    col = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return col.clamp_(max=logits.shape[-1] - 1)


def _candidates(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                num: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `num` largest logits per row with top-k and top-p applied (dropped ones set
    to -inf), their vocab ids, and which rows' nucleus did not fit in `num`."""
    vocab = x.shape[-1]
    vals, ids = x.topk(num, dim=-1)
    k = torch.where(top_k > 0, top_k, vocab)
    col = torch.arange(num, device=x.device)
    vals = vals.masked_fill(col[None, :] >= k[:, None], float("-inf"))
    # Top-p applies to the top-k-filtered distribution (as in transformers): normalise
    # over the kept top-k when top-k cut inside the candidates, else over the whole row.
    norm = torch.where(k <= num, torch.logsumexp(vals, dim=-1), torch.logsumexp(x, dim=-1))
    probs = torch.exp(vals - norm[:, None])
    mass_before = probs.cumsum(dim=-1) - probs
    outside = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)  # 1.0: rounding-proof
    vals = vals.masked_fill(outside, float("-inf"))
    incomplete = (top_p < 1.0) & (k > num) & (probs.sum(dim=-1) < top_p)
    return vals, ids, incomplete


def _sample_random(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   u: torch.Tensor) -> torch.Tensor:
    vocab = x.shape[-1]
    cut = (top_k > 0) | (top_p < 1.0)
    if not bool(cut.any()):
        return _draw(x, u)
    num = int(top_k.max()) if bool((top_k > 0).any()) else 0
    if bool((top_p < 1.0).any()):
        num = max(num, TOP_P_CANDIDATES)
    num = min(num, vocab)
    vals, ids, incomplete = _candidates(x, top_k, top_p, num)
    out = ids.gather(1, _draw(vals, u)[:, None]).squeeze(1)
    if bool(incomplete.any()):  # rare: flat distributions; redo those rows exactly
        rows = incomplete.nonzero().squeeze(1)
        vals, ids, _ = _candidates(x[rows], top_k[rows], top_p[rows], vocab)
        out[rows] = ids.gather(1, _draw(vals, u[rows])[:, None]).squeeze(1)
    return out


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           sample_indices: Sequence[int]) -> list[int]:
    """Token ids for logits `[B, V]` (float32). `sample_indices[b]` is how many tokens
    row b's request has generated so far (it keys the seeded generator)."""
    temps = [p.temperature for p in params]
    out = logits.argmax(dim=-1)
    random_rows = [b for b, p in enumerate(params) if p.temperature > 0 and p.top_k != 1]
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)
        t = torch.tensor([temps[b] for b in random_rows], device=logits.device)
        x = logits.index_select(0, rows) / t[:, None]
        top_k = torch.tensor([params[b].top_k for b in random_rows], device=logits.device)
        top_p = torch.tensor([params[b].top_p for b in random_rows], device=logits.device,
                             dtype=logits.dtype)
        u = _row_uniforms([params[b].seed for b in random_rows],
                          [sample_indices[b] for b in random_rows])
        out[rows] = _sample_random(x, top_k, top_p, u)
    return out.tolist()
