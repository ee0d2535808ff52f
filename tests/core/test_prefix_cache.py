"""Automatic prefix caching in the KV manager and the scheduler: the hash chain, reference
counts, the LRU free queue, admission net of shared blocks, the last-token rule, the
counters, and what preemption and a failed step do to cached blocks."""

from __future__ import annotations

import pytest
from factories import FakeRunner, make_requests, make_scheduler, run_until_done, step

from stepserve.config.settings import ConfigError
from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.prefix_hash import HASH_ALGOS, namer
from stepserve.core.request import Request, SamplingParams

PROMPT = list(range(100, 148))  # 48 tokens: 12 blocks of 4


def req(rid: str, prompt: list[int], max_tokens: int = 4,
        prompt_logprobs: int | None = None) -> Request:
    return Request(rid, list(prompt), SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
        prompt_logprobs=prompt_logprobs), 0.0)


def salted(rid: str, prompt: list[int], salt: str | None) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=4, temperature=0.0), 0.0,
                   cache_salt=salt)


def computed(kv: KVCacheManager, r: Request, n: int) -> None:
    """`r` gets blocks for `n` tokens and computes them (as a completed step would)."""
    assert kv.allocate_slots(r, n)
    r.num_computed_tokens += n
    kv.cache_blocks(r, r.num_computed_tokens)


# ---- the hash chain ----

@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_a_block_is_named_by_its_parent_and_its_tokens(algo):
    names = namer(algo)
    a = salted("a", PROMPT, None)
    b = salted("b", PROMPT[:8] + [999] + PROMPT[9:], None)  # differs in block 2 only
    ha, hb = names.names(a, 12, 4), names.names(b, 12, 4)
    assert ha[:2] == hb[:2]
    assert all(x != y for x, y in zip(ha[2:], hb[2:]))  # a different parent: all differ
    # the same tokens after another parent get another name
    assert names.name(ha[0], PROMPT[4:8]) == ha[1]
    assert names.name(hb[2], PROMPT[12:16]) != ha[3]
    assert names.prompt_names(PROMPT, None, 4) == ha
    assert names.prompt_names(PROMPT, None, 4, count=3) == ha[:3]


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_cache_salt_isolates_whole_chains(algo):
    plain, x1, x2, y = (salted(k, PROMPT, s) for k, s in
                        (("p", None), ("x1", "tenant-x"), ("x2", "tenant-x"), ("y", "tenant-y")))
    names = [namer(algo).names(r, 12, 4) for r in (plain, x1, x2, y)]
    assert names[1] == names[2]
    assert not set(names[0]) & set(names[1]) and not set(names[1]) & set(names[3])
    assert namer(algo).root("") == namer(algo).root(None)


@pytest.mark.parametrize("algo", ["builtin", "xxhash"])
def test_a_fast_name_carries_its_salt_so_no_collision_crosses_salts(algo):
    """The fast hashes are not collision resistant; a salted request's names hold the
    salt itself, so even equal hash values under two salts are different names."""
    x = namer(algo).names(salted("x", PROMPT, "tenant-x"), 12, 4)
    assert all(type(h) is tuple and h[0] == "tenant-x" for h in x)
    forged = [("tenant-y", value) for _, value in x]  # the same values under another salt
    assert not set(forged) & set(x)
    assert not set(value for _, value in x) & set(x)  # nor the unsalted names


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_names_cover_output_tokens_and_grow_lazily(algo):
    names = namer(algo)
    r = salted("a", PROMPT[:6], None)
    r.output_token_ids += [7, 8]
    assert names.names(r, 2, 4)[1] == names.name(names.names(r, 1, 4)[0],
                                                 PROMPT[4:6] + [7, 8])
    assert len(r.block_hashes) == 2
    with pytest.raises(ValueError, match="not full"):
        names.names(r, 3, 4)


def test_the_names_are_the_same_in_every_process():
    """Python's hash() of str and bytes changes with PYTHONHASHSEED; the chains must
    not, or a simulation would depend on the process it ran in."""
    import subprocess
    import sys

    code = ("from stepserve.core.prefix_hash import namer; "
            "print([namer(a).prompt_names(list(range(64)), s, 16) "
            "for a in ('builtin', 'xxhash', 'sha256') for s in (None, 'salt')])")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed},
                           check=True).stdout for seed in ("1", "2")}
    assert len(runs) == 1


def test_an_unknown_hash_algo_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="builtin, sha256, xxhash"):
        namer("md5")
    with pytest.raises(ConfigError, match="prefix_caching_hash_algo"):
        from stepserve.config.settings import CacheConfig
        CacheConfig(prefix_caching_hash_algo="sha256_cbor")


# ---- reference counts and the LRU ----

def test_a_shared_prefix_is_held_by_every_request_that_uses_it():
    kv = KVCacheManager(num_gpu_blocks=32, block_size=4)
    a, b = req("a", PROMPT), req("b", PROMPT[:40] + [1, 2, 3])
    computed(kv, a, 48)
    hits = kv.cached_prefix(b)
    assert hits == kv.block_table("a")[:10]  # 40 shared tokens: 10 blocks
    assert kv.allocate_slots(b, 3, cached=hits)
    assert [kv.gpu.ref_cnt[x] for x in kv.block_table("a")] == [2] * 10 + [1] * 2
    kv.check_integrity()
    kv.free(a)
    assert [kv.gpu.ref_cnt[x] for x in hits] == [1] * 10  # b still holds them
    kv.check_integrity()
    kv.free(b)
    assert kv.all_free and len(kv.gpu.cached) == 12  # all still cached, none held
    kv.check_integrity()


def test_the_hit_leaves_the_last_token_to_compute():
    kv = KVCacheManager(num_gpu_blocks=32, block_size=4)
    a = req("a", PROMPT)
    computed(kv, a, 48)
    assert len(kv.cached_prefix(req("b", PROMPT))) == 11  # 47 // 4: one block recomputed
    assert len(kv.cached_prefix(req("c", PROMPT + [5]))) == 12  # 48 // 4: all of a's
    assert kv.cached_prefix(req("d", PROMPT, prompt_logprobs=0)) == []  # must score them


def test_unnamed_blocks_go_first_then_the_least_recently_used_tail_first():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a, b, partial = req("a", PROMPT[:12]), req("b", PROMPT[20:32]), req("p", [9] * 6)
    computed(kv, a, 12)
    computed(kv, b, 12)
    computed(kv, partial, 6)  # one full block named, the second half-filled
    ta, tb, tp = (list(kv.block_table(r)) for r in ("a", "b", "p"))
    kv.free(a)
    kv.free(partial)
    kv.free(b)
    # head first: the half-filled block (nothing to reuse), then a's blocks from its tail,
    # then p's named block, then b's (freed last) from its tail
    assert kv.gpu.free == [tp[1], ta[2], ta[1], ta[0], tp[0], tb[2], tb[1], tb[0]]
    kv.allocate_slots(req("new", [1] * 8), 8)  # two blocks: one evicts a's tail
    assert kv.prefix_cache_evictions == 1
    assert len(kv.cached_prefix(req("a2", PROMPT[:12] + [1]))) == 2  # a's head survives
    kv.check_integrity()


def test_a_hit_on_a_free_block_takes_it_out_of_the_free_queue():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a = req("a", PROMPT[:8])
    computed(kv, a, 8)
    kv.free(a)
    b = req("b", PROMPT[:8] + [1])
    hits = kv.cached_prefix(b)
    assert len(hits) == 2 and kv.num_free_blocks == 8
    assert kv.allocate_slots(b, 1, cached=hits)
    assert kv.num_free_blocks == 5 and not set(hits) & set(kv.gpu.free)
    kv.check_integrity()


def test_admission_counts_only_the_blocks_it_does_not_share():
    # a holds 10 of 12 blocks; b shares all 10 and needs 1 more: it fits beside a
    kv = KVCacheManager(num_gpu_blocks=12, block_size=4)
    a, b = req("a", PROMPT[:40]), req("b", PROMPT[:44])
    computed(kv, a, 40)
    hits = kv.cached_prefix(b)
    assert len(hits) == 10
    assert kv.allocate_slots(b, 4, cached=hits)
    assert kv.num_free_blocks == 1
    # hits still free count too: they leave the free queue
    kv2 = KVCacheManager(num_gpu_blocks=12, block_size=4)
    c, d = req("c", PROMPT[:40]), req("d", PROMPT)
    computed(kv2, c, 40)
    kv2.free(c)
    assert kv2.allocate_slots(req("h", [3] * 4), 4)  # 11 free, 10 of them c's
    hits = kv2.cached_prefix(d)
    assert len(hits) == 10
    assert not kv2.allocate_slots(d, 8, cached=hits)  # 10 hits + 2 new > 11 free
    assert kv2.allocate_slots(d, 4, cached=hits)  # 10 hits + 1 new == 11 free
    kv2.check_integrity()


def test_check_integrity_sees_a_wrong_count_and_a_stale_name():
    from stepserve.core.kv_cache import KVCacheError

    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a = req("a", PROMPT[:8])
    computed(kv, a, 8)
    b0 = kv.block_table("a")[0]
    kv.gpu.ref_cnt[b0] += 1
    kv.gpu.num_refs += 1
    with pytest.raises(KVCacheError, match="references"):
        kv.check_integrity(full=False)
    kv.gpu.ref_cnt[b0] -= 1
    kv.gpu.num_refs -= 1
    kv.gpu.block_hash[b0] = b"stale"
    with pytest.raises(KVCacheError, match="name"):
        kv.check_integrity()


# ---- the scheduler ----

def test_a_cached_prefix_is_not_computed_again_and_is_counted():
    sched = make_scheduler(block_size=4, max_model_len=128)
    (first,) = make_requests(1, max_tokens=2, prompt=PROMPT)
    sched.add_request(first)
    run_until_done(sched)
    (second,) = make_requests(1, max_tokens=2, prompt=PROMPT[:44] + [7, 7, 7, 7], prefix="s")
    sched.add_request(second)
    out = step(sched)
    assert out.num_scheduled_tokens == [4]  # 44 from the cache
    assert second.num_cached_tokens == 44 and second.prefix_hit_tokens == 44
    assert sched.kv.prefix_cache_queries == 48 + 48 and sched.kv.prefix_cache_hits == 44
    run_until_done(sched)
    assert second.num_cached_tokens == 44 and sched.kv.all_free


def test_without_prefix_caching_nothing_is_shared():
    sched = make_scheduler(block_size=4, max_model_len=128, enable_prefix_caching=False)
    for r in make_requests(2, max_tokens=2, prompt=PROMPT):
        sched.add_request(r)
        run_until_done(sched)
        assert r.num_cached_tokens == 0
    assert not sched.kv.gpu.cached and sched.kv.prefix_cache_queries == 0


def test_the_budget_counts_only_uncached_tokens():
    sched = make_scheduler(block_size=4, max_model_len=128, max_num_batched_tokens=16,
                           long_prefill_token_threshold=16)
    (a,) = make_requests(1, max_tokens=1, prompt=PROMPT)
    sched.add_request(a)
    run_until_done(sched)  # 48 tokens: three chunks
    (b,) = make_requests(1, max_tokens=1, prompt=PROMPT[:40] + [1] * 8, prefix="b")
    (c,) = make_requests(1, max_tokens=1, prompt=PROMPT[:40] + [2] * 8, prefix="c")
    for r in (b, c):
        sched.add_request(r)
    out = step(sched)
    # both prompts' uncached 8 tokens fit one 16-token budget: no chunking
    assert out.requests == [b, c] and out.num_scheduled_tokens == [8, 8]


def test_prompt_logprobs_skip_the_lookup():
    sched = make_scheduler(block_size=4, max_model_len=128)
    (a,) = make_requests(1, max_tokens=1, prompt=PROMPT)
    sched.add_request(a)
    run_until_done(sched)
    b = req("b", PROMPT, max_tokens=1, prompt_logprobs=0)
    sched.add_request(b)
    assert step(sched).num_scheduled_tokens == [48]
    assert b.num_cached_tokens == 0


def test_tenants_with_different_salts_share_nothing():
    sched = make_scheduler(block_size=4, max_model_len=128)
    for salt, hit in (("x", 0), ("y", 0), ("x", 44)):
        (r,) = make_requests(1, max_tokens=1, prompt=PROMPT, cache_salt=salt, prefix=salt)
        sched.add_request(r)
        run_until_done(sched)
        assert r.num_cached_tokens == hit


def test_recompute_preemption_finds_its_own_blocks_again():
    sched = make_scheduler(num_gpu_blocks=12, block_size=4, max_model_len=48,
                           max_num_seqs=2, preemption_mode="recompute")
    a, b = make_requests(2, prompt_len=16, max_tokens=24)
    for r in (a, b):
        sched.add_request(r)
    while not b.num_preemptions:
        step(sched)
    dropped = b.num_recomputed_tokens
    assert dropped > 0 and b in sched.waiting
    run_until_done(sched)
    assert b.prefix_hit_tokens > 0  # readmitted from its own cached blocks
    assert b.num_cached_tokens == 0  # usage counts the first admission only
    assert len(b.output_token_ids) == 24 and sched.kv.all_free


def test_swapping_out_a_sharer_leaves_the_shared_blocks_with_the_others():
    sched = make_scheduler(num_gpu_blocks=14, block_size=4, max_model_len=48, max_num_seqs=3,
                           preemption_mode="swap", num_cpu_blocks=32)
    first, *rest = make_requests(3, max_tokens=24, prompt=PROMPT[:20])
    sched.add_request(first)
    step(sched)
    for r in rest:
        sched.add_request(r)
    swapped = False
    while sched.has_unfinished():
        out = step(sched)  # checks integrity after every step
        swapped |= bool(out.swap_out)
    assert swapped
    assert all(len(r.output_token_ids) == 24 for r in (first, *rest))
    assert sched.kv.all_free and rest[0].num_cached_tokens == 16


def test_a_failed_step_caches_nothing_it_was_computing():
    sched = make_scheduler(block_size=4, max_model_len=128)
    (a,) = make_requests(1, max_tokens=2, prompt=PROMPT)
    sched.add_request(a)
    out = sched.schedule()
    sched.fail_step(out, "the runner broke")
    assert not sched.kv.gpu.cached and a.is_finished
    (b,) = make_requests(1, max_tokens=2, prompt=PROMPT, prefix="b")
    sched.add_request(b)
    assert step(sched).num_scheduled_tokens == [48]


def test_a_pool_of_exactly_one_max_model_len_sequence_is_accepted_and_used():
    # 16 blocks of 16 = 256 tokens = max_model_len; the watermark keeps 1 block back, but
    # only while another request holds blocks
    sched = make_scheduler(num_gpu_blocks=16, block_size=16, max_model_len=256, watermark=0.1)
    (r,) = make_requests(1, prompt_len=250, max_tokens=6)  # all 16 blocks at admission
    sched.add_request(r)
    run_until_done(sched)
    assert len(r.output_token_ids) == 6 and sched.kv.all_free
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        make_scheduler(num_gpu_blocks=15, block_size=16, max_model_len=256)


# ---- lpm ----

def _lpm_sched(**kw):
    sched = make_scheduler(block_size=4, max_model_len=128, policy="lpm", max_num_seqs=1, **kw)
    (warm,) = make_requests(1, max_tokens=1, prompt=PROMPT, prefix="warm")
    sched.add_request(warm)
    run_until_done(sched)
    return sched


def test_lpm_admits_the_longest_cached_prefix_first():
    sched = _lpm_sched()
    cold = make_requests(1, max_tokens=1, prefix="cold", arrival=0.0)[0]
    some = make_requests(1, max_tokens=1, prompt=PROMPT[:8] + [1] * 8, prefix="some")[0]
    most = make_requests(1, max_tokens=1, prompt=PROMPT[:24] + [1] * 8, prefix="most")[0]
    for r in (cold, some, most):
        sched.add_request(r)
    order = []
    while sched.has_unfinished():
        out = step(sched, FakeRunner())
        order += [r.request_id for r in out.requests if r.first_scheduled_time is not None
                  and r.request_id not in order]
    assert order == ["most0", "some0", "cold0"]


def test_lpm_aging_lets_a_cold_request_go_first_once_it_has_waited():
    sched = _lpm_sched(aging_after_s=0.5)
    now = sched.clock.now()
    (cold,) = make_requests(1, max_tokens=1, prefix="cold", arrival=now - 1.0)
    (hot,) = make_requests(1, max_tokens=1, prompt=PROMPT[:24] + [1] * 8, prefix="hot",
                           arrival=now)
    sched.add_request(hot)
    sched.add_request(cold)
    assert step(sched).requests == [cold]  # waited past aging_after_s: ahead of hot


# ---- a burst sharing a prefix ----

def test_a_burst_sharing_a_prefix_computes_it_once():
    """Prompts admitted in one step would each compute the shared part (a block is
    cached once its step completes): the followers wait one step and hit it instead."""
    sched = make_scheduler(block_size=4, max_model_len=128)
    burst = [make_requests(1, max_tokens=2, prompt=PROMPT + [i], prefix=f"b{i}")[0]
             for i in range(4)]
    for r in burst:
        sched.add_request(r)
    first = step(sched)
    assert first.requests == burst[:1] and first.num_scheduled_tokens == [49]
    second = step(sched)
    assert second.requests[1:] == burst[1:] and second.num_scheduled_tokens[1:] == [1, 1, 1]
    assert [r.num_cached_tokens for r in burst] == [0, 48, 48, 48]
    run_until_done(sched)


def test_a_burst_waits_only_for_blocks_it_could_take_from_the_cache():
    sched = make_scheduler(block_size=4, max_model_len=128)
    # one block each, holding the last token: computed by each, so nobody waits for it
    for r in make_requests(3, max_tokens=2, prompt=PROMPT[:4]):
        sched.add_request(r)
    assert step(sched).num_scheduled_tokens == [4, 4, 4]
    logprobs = req("lp", PROMPT, prompt_logprobs=0)  # reads no cache: nothing to wait for
    for r in (req("hit", PROMPT), logprobs):
        sched.add_request(r)
    assert [r.request_id for r in step(sched).requests][-2:] == ["hit", "lp"]
