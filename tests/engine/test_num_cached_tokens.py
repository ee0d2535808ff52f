"""RequestOutput.num_cached_tokens (vLLM's field): the prompt tokens served from the
prefix cache at admission, the same per-sequence count the server's usage reports."""

from __future__ import annotations

import pytest

from stepserve import LLM, SamplingParams

BLOCK = 16
PROMPT = {"prompt_token_ids": [5 + (i % 40) for i in range(5 * BLOCK + 3)]}  # 5 full blocks
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _twice(llm: LLM):
    return [llm.generate([PROMPT], PARAMS, use_tqdm=False)[0] for _ in range(2)]


@pytest.fixture(scope="module")
def cached_llm():
    return LLM("tiny", max_model_len=256, max_num_seqs=4, block_size=BLOCK)


def test_a_repeated_prompt_reports_its_cached_blocks(cached_llm):
    first, second = _twice(cached_llm)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 5 * BLOCK  # every full prompt block
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_n_sequences_report_the_fewest_cached_tokens(cached_llm):
    # siblings may hit blocks their own first sibling just computed; the request reports
    # what all of them got from before it (the server's usage counts it the same way)
    prompt = {"prompt_token_ids": [90 + (i % 30) for i in range(3 * BLOCK + 1)]}
    params = SamplingParams(temperature=0.8, max_tokens=2, n=3, seed=1)
    out = cached_llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(out.outputs) == 3 and out.num_cached_tokens == 0
    again = cached_llm.generate([prompt], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 3 * BLOCK


def test_without_prefix_caching_nothing_is_cached():
    llm = LLM("tiny", max_model_len=256, max_num_seqs=4, block_size=BLOCK,
              enable_prefix_caching=False)
    assert [o.num_cached_tokens for o in _twice(llm)] == [0, 0]
