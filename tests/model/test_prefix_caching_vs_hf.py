"""The default model with prefix caching on (the default) against transformers' greedy
generate: requests that share a prefix with earlier ones, served partly from the cache,
give transformers' tokens, one prompt at a time, token for token."""

from __future__ import annotations

import random

import pytest

from stepserve.core.request import SamplingParams

NEW_TOKENS = 12


@pytest.mark.slow
def test_default_model_serves_shared_prefixes_from_the_cache_as_transformers_computes_them(
        default_dir, reference):
    from stepserve import LLM
    from stepserve.model.ggml_kernels import kernels_unavailable_reason

    rng = random.Random(1)

    def ids(k: int) -> list[int]:
        return [rng.randrange(4, 20000) for _ in range(k)]

    shared = ids(64)
    first = [shared + ids(7), shared[:40] + ids(20)]
    second = [shared + ids(3), shared, shared + ids(33), list(first[0]), shared[:40] + ids(2)]
    expected = reference(default_dir, first + second, NEW_TOKENS)

    llm = LLM(str(default_dir), max_model_len=256, block_size=16, max_num_batched_tokens=64,
              long_prefill_token_threshold=32)
    auto = "q4_1" if kernels_unavailable_reason() is None else "none"
    assert llm.engine.runner.quantization == auto  # the GGUF's own groups where they run
    assert llm.engine.config.cache.enable_prefix_caching
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = []
    for batch in (first, second):
        outs += llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    cached = {r.request_id: r.num_cached_tokens for r in llm.scheduler.finished}
    # the first round's second prompt waits for the first's chunks (one partial prefill
    # at a time) and so already finds their first two blocks
    assert [cached[o.request_id] for o in outs] == [0, 32, 64, 48, 64, 64, 32]
    assert llm.scheduler.kv.all_free
