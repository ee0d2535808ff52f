"""Static and dynamic batching look up the prefix cache at admission as continuous
batching does (one lookup, `KVCacheManager.take_prefix_hit`): the baselines are compared with
continuous batching on equal terms with caching on."""

from __future__ import annotations

import pytest
from factories import make_requests, make_scheduler, run_until_done, step

PROMPT = list(range(1, 49))  # 48 tokens: 12 full blocks of 4
MODES = ["continuous", "static", "dynamic"]


def _sched(mode: str, **kw):
    return make_scheduler(block_size=4, max_model_len=128, batching=mode,
                          batch_window_s=0.0, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_a_repeated_prompt_starts_from_its_cached_prefix(mode):
    sched = _sched(mode)
    (first,) = make_requests(1, max_tokens=2, prompt=PROMPT)
    sched.add_request(first)
    run_until_done(sched)
    assert first.num_cached_tokens == 0
    (again,) = make_requests(1, max_tokens=2, prompt=PROMPT, prefix="again")
    sched.add_request(again)
    out = step(sched)
    # 11 blocks from the cache: the last block holds the token that must be computed
    assert out.num_scheduled_tokens == [4]
    assert again.num_cached_tokens == 44 and again.prefix_hit_tokens == 44
    assert sched.kv.prefix_cache_queries == 96 and sched.kv.prefix_cache_hits == 44
    run_until_done(sched)
    assert again.output_token_ids == first.output_token_ids
    sched.check_integrity()
    assert sched.kv.all_free


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_batch_shares_the_cached_blocks_instead_of_reserving_them(mode):
    sched = _sched(mode)
    (first,) = make_requests(1, max_tokens=2, prompt=PROMPT)
    sched.add_request(first)
    run_until_done(sched)
    batch = make_requests(3, max_tokens=8, prompt=PROMPT[:44] + [7, 7, 7, 7], prefix="b")
    for r in batch:
        sched.add_request(r)
    step(sched)
    tables = [sched.kv.block_table(r.request_id) for r in batch]
    shared = tables[0][:11]
    assert all(t[:11] == shared for t in tables)  # held by reference, not reserved thrice
    assert [r.num_cached_tokens for r in batch] == [44, 44, 44]
    sched.check_integrity()
    run_until_done(sched)
    sched.check_integrity()
    assert sched.kv.all_free


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_without_prefix_caching_a_baseline_shares_nothing(mode):
    sched = _sched(mode, enable_prefix_caching=False)
    for r in make_requests(2, max_tokens=2, prompt=PROMPT):
        sched.add_request(r)
        run_until_done(sched)
        assert r.num_cached_tokens == 0
    assert sched.kv.prefix_cache_queries == 0 and sched.kv.all_free
