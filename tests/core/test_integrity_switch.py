"""The debug switch: with it on, the engine core checks blocks and queues after every step
and a leak raises at the step that made it; with it off, nothing is checked."""

from __future__ import annotations

import pytest
from factories import FakeRunner, make_config, make_requests, make_scheduler, run_until_done

from stepserve.core.base import CHECK_INTEGRITY_ENV, integrity_checks_on
from stepserve.core.clock import VirtualClock
from stepserve.core.engine_core import EngineCore
from stepserve.core.kv_cache import KVCacheError, KVCacheManager


def test_the_suite_runs_with_the_switch_on():
    assert integrity_checks_on()


def _leaky_core(monkeypatch) -> EngineCore:
    core = EngineCore(make_config(max_model_len=256), FakeRunner(), VirtualClock(), 64)
    # a request that ends without giving its blocks back
    monkeypatch.setattr(core.scheduler.kv, "free", lambda request: None)
    return core


def test_a_leak_raises_at_the_step_that_made_it(monkeypatch):
    core = _leaky_core(monkeypatch)
    (req,) = make_requests(1, prompt_len=8, max_tokens=2)
    core.add_request(req)
    with pytest.raises(KVCacheError, match="ended or unknown request"):
        while core.has_unfinished():
            core.step()


def test_off_means_unchecked(monkeypatch):
    monkeypatch.setenv(CHECK_INTEGRITY_ENV, "0")
    core = _leaky_core(monkeypatch)
    (req,) = make_requests(1, prompt_len=8, max_tokens=2)
    core.add_request(req)
    while core.has_unfinished():
        core.step()
    assert core.scheduler.kv.block_tables  # the leak went unnoticed


def test_scheduler_check_sees_a_request_in_two_queues():
    sched = make_scheduler()
    (req,) = make_requests(1)
    sched.add_request(req)
    sched.running.append(req)
    with pytest.raises(KVCacheError, match="queues hold"):
        sched.check_integrity()


@pytest.mark.parametrize("full", [True, False], ids=["full", "counts"])
@pytest.mark.parametrize("corrupt", ["double_free", "held_not_in_table", "free_and_held",
                                     "two_tables"])
def test_block_manager_check_sees_each_corruption(corrupt, full):
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a, b = make_requests(2, prompt_len=8)
    assert kv.allocate_slots(a, 8) and kv.allocate_slots(b, 4)
    kv.check_integrity()
    if corrupt == "double_free":  # a block freed while its table still names it
        kv.gpu.release([kv.block_tables["r0"][0]])
    elif corrupt == "held_not_in_table":
        kv.block_tables["r0"].pop()
    elif corrupt == "free_and_held":
        kv.gpu.free_queue[kv.block_tables["r0"][0]] = None
    else:
        kv.block_tables["r1"].append(kv.block_tables["r0"][0])
    with pytest.raises(KVCacheError):
        kv.check_integrity(full)


def test_a_clean_run_passes_every_check():
    sched = make_scheduler(num_gpu_blocks=16, max_num_seqs=4, max_model_len=64)
    for r in make_requests(10, prompt_len=20, max_tokens=12):
        sched.add_request(r)
    run_until_done(sched)  # factories.step checks after each step
    assert sched.kv.all_free


def test_a_swapped_block_moved_between_tables_needs_the_full_check():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=4)
    a, b = make_requests(2, prompt_len=8)
    assert kv.allocate_slots(a, 8) and kv.allocate_slots(b, 8)
    # the same counts, but r1's table now names a free block instead of its own
    held = kv.block_tables["r1"][0]
    kv.block_tables["r1"][0] = kv.gpu.free[0]
    kv.check_integrity(full=False)
    with pytest.raises(KVCacheError, match=f"block {held}|block {kv.gpu.free[0]}"):
        kv.check_integrity(full=True)
