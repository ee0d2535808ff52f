"""Prefix caching on the real engine (the tiny model): the engine computes only what the
cache does not hold, attention reads the cached blocks through the paged cache, and the
greedy tokens are the same with the cache on and off, whether prompts split into chunks,
get preempted (recompute or swap) or are cached whole."""

from __future__ import annotations

import random

import pytest

from stepserve.core.request import SamplingParams

NEW_TOKENS = 10
CASES = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=16, long_prefill_token_threshold=8,
                    max_num_partial_prefills=2, max_long_partial_prefills=2),
    "recompute": dict(block_size=4, num_gpu_blocks=40, preemption_mode="recompute",
                      max_num_batched_tokens=64, long_prefill_token_threshold=16),
    "swap": dict(block_size=4, num_gpu_blocks=40, num_cpu_blocks=200, preemption_mode="swap",
                 max_num_batched_tokens=64, long_prefill_token_threshold=16),
}


def prompts(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Two rounds sharing a 48-token prefix: the first warms the cache, the second hits
    it (a repeat, the prefix alone, a prompt shorter than the prefix, longer ones)."""
    rng = random.Random(seed)
    shared = [rng.randrange(4, 500) for _ in range(48)]

    def tail(k: int) -> list[int]:
        return [rng.randrange(4, 500) for _ in range(k)]

    first = [shared + tail(5), shared[:20] + tail(30), shared + tail(17)]
    second = [list(first[0]), shared, shared[:37], shared + tail(1), shared + tail(40),
              shared[:20] + tail(3), shared + tail(9)]
    return first, second


def generate(model_dir, caching: bool, settings: dict):
    from stepserve import LLM

    llm = LLM(str(model_dir), max_model_len=160, watermark=0.0,
              enable_prefix_caching=caching, **settings)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = []
    for batch in prompts():
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        tokens += [o.outputs[0].token_ids for o in outs]
    kv = llm.scheduler.kv
    kv.check_integrity()
    assert kv.all_free
    return tokens, llm.scheduler.finished, kv


@pytest.mark.parametrize("name", sorted(CASES))
def test_cached_and_uncached_runs_give_the_same_tokens(tiny_dir, name):
    want, _, off = generate(tiny_dir, False, CASES[name])
    got, finished, kv = generate(tiny_dir, True, CASES[name])
    assert got == want
    assert off.prefix_cache_hits == 0 and not off.gpu.cached
    assert kv.prefix_cache_hits > 0
    cached = {r.request_id: r.num_cached_tokens for r in finished}
    assert sum(cached.values()) > 0
    if name in ("recompute", "swap"):
        assert any(r.num_preemptions for r in finished), "the pool was meant to preempt"


def test_a_whole_cached_prompt_recomputes_only_its_last_block(tiny_dir):
    got, finished, kv = generate(tiny_dir, True, dict(block_size=16))
    by_prompt = {tuple(r.prompt_token_ids): r for r in finished}
    first, second = prompts()
    assert by_prompt[tuple(second[1])].num_cached_tokens == 32  # 48 tokens: the 3rd block again
    assert by_prompt[tuple(second[3])].num_cached_tokens == 48  # 49: all but the new token
    uncached, _, _ = generate(tiny_dir, False, dict(block_size=16))
    assert got == uncached


def test_prompt_logprobs_are_the_same_with_the_cache_warm(tiny_dir):
    from stepserve import LLM

    first, second = prompts()
    llm = LLM(str(tiny_dir), max_model_len=160, watermark=0.0)
    greedy = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    scored = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    cold = llm.generate([{"prompt_token_ids": second[0]}], scored, use_tqdm=False)[0]
    llm.generate([{"prompt_token_ids": first[0]}], greedy, use_tqdm=False)
    warm = llm.generate([{"prompt_token_ids": second[0]}], scored, use_tqdm=False)[0]
    assert len(warm.prompt_logprobs) == len(cold.prompt_logprobs) == len(second[0])
    assert [next(iter(p.values())).logprob if p else None for p in warm.prompt_logprobs] \
        == pytest.approx([next(iter(p.values())).logprob if p else None
                          for p in cold.prompt_logprobs])
