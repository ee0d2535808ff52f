import pytest
from factories import make_requests

from stepserve.core.kv_cache import KVCacheError, KVCacheManager


def test_allocate_append_free_keeps_integrity():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a, b = make_requests(2, prompt_len=6)
    assert kv.allocate_slots(a, 6)  # 2 blocks
    assert len(kv.block_table("r0")) == 2
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 2)  # fits in block 2: no new block
    assert len(kv.block_table("r0")) == 2
    a.num_computed_tokens = 8
    assert kv.allocate_slots(a, 1)
    assert len(kv.block_table("r0")) == 3
    assert kv.allocate_slots(b, 20)  # 5 blocks: all the rest
    assert kv.num_free_blocks == 0
    kv.check_integrity()
    kv.free(a)
    kv.free(b)
    assert kv.all_free
    kv.check_integrity()


def test_capacity_failure_is_a_return_value_and_changes_nothing():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4)
    a, b = make_requests(2)
    assert kv.allocate_slots(a, 12)
    assert not kv.allocate_slots(b, 8)
    assert kv.block_table("r1") == []
    assert kv.num_free_blocks == 1
    kv.check_integrity()


def test_watermark_holds_back_new_requests_but_not_running_ones():
    kv = KVCacheManager(num_gpu_blocks=10, block_size=4, watermark=0.2)  # keep 2 free
    a, b = make_requests(2)
    assert kv.allocate_slots(a, 32)  # 8 blocks, leaves exactly 2
    assert not kv.allocate_slots(b, 1)  # new: would dip under the watermark
    a.num_computed_tokens = 32
    assert kv.allocate_slots(a, 1)  # running: may use the reserve


def test_reserve_total_allocates_the_worst_case_up_front():
    kv = KVCacheManager(num_gpu_blocks=10, block_size=4)
    (a,) = make_requests(1, prompt_len=5, max_tokens=11)
    assert kv.allocate_slots(a, 5, reserve_total=a.max_total_tokens)
    assert len(kv.block_table("r0")) == 4  # 16 tokens


def test_swap_out_and_in_round_trip():
    kv = KVCacheManager(num_gpu_blocks=6, block_size=4, num_cpu_blocks=3)
    a, b = make_requests(2)
    kv.allocate_slots(a, 12)
    out_pairs = kv.swap_out(a)
    assert len(out_pairs) == 3 and kv.block_table("r0") == []
    assert kv.num_free_blocks == 6 and kv.cpu.num_free == 0
    kv.check_integrity()
    kv.allocate_slots(b, 16)  # takes 4 of the freed blocks
    assert kv.swap_in(a) == []  # only 2 free: no change
    kv.free(b)
    in_pairs = kv.swap_in(a)
    assert [c for c, _ in in_pairs] == [c for _, c in out_pairs]
    assert kv.cpu.num_free == 3
    kv.check_integrity()


def test_swap_out_refuses_when_cpu_pool_is_full():
    kv = KVCacheManager(num_gpu_blocks=6, block_size=4, num_cpu_blocks=1)
    (a,) = make_requests(1)
    kv.allocate_slots(a, 8)
    assert kv.swap_out(a) == []
    assert len(kv.block_table("r0")) == 2


def test_integrity_check_catches_a_double_free():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4)
    (a,) = make_requests(1)
    kv.allocate_slots(a, 4)
    kv.gpu.release(kv.block_table("r0"))  # corrupt: freed while its table names it
    with pytest.raises(KVCacheError):
        kv.check_integrity()
