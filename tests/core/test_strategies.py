"""Budget orders and preemption modes: small classes chosen by name from one registry
each, resolved once when the scheduler is built."""

import pytest
from factories import make_requests, make_scheduler

from stepserve.config import settings as config
from stepserve.config.settings import SchedulerConfig
from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.policies import make_policy
from stepserve.core.request import RequestStatus
from stepserve.core.scheduler import (
    BUDGET_ORDERS,
    PREEMPTIONS,
    NoPreemption,
    PrefillFirst,
    Recompute,
    Swap,
    make_budget_order,
    make_preemption,
)


def test_registries_hold_exactly_the_names_config_accepts():
    assert tuple(BUDGET_ORDERS) == config.BUDGET_ORDERS
    assert tuple(PREEMPTIONS) == config.PREEMPTION_MODES
    assert [make_policy(name).name for name in config.POLICIES] == list(config.POLICIES)


def test_registries_refuse_an_unknown_name_naming_the_field_and_the_choices():
    with pytest.raises(ValueError, match="budget_order = 'fastest': must be one of "
                                         "decode_first, prefill_first"):
        make_budget_order("fastest", SchedulerConfig())
    with pytest.raises(ValueError, match="preemption_mode = 'kill': must be one of "
                                         "recompute, swap, none"):
        make_preemption("kill")


@pytest.mark.parametrize("order", config.BUDGET_ORDERS)
@pytest.mark.parametrize("mode", config.PREEMPTION_MODES)
def test_the_scheduler_resolves_its_strategies_by_name(order, mode):
    sched = make_scheduler(budget_order=order, preemption_mode=mode)
    assert sched.budget_order.name == order
    assert sched.preemption.name == mode


def test_prefill_first_leaves_decode_the_budget_minus_the_chunk_cap():
    sc = SchedulerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16,
                         max_model_len=64)
    order = make_budget_order("prefill_first", sc)
    assert isinstance(order, PrefillFirst)
    assert order.decode_budget(40, num_prefill_tokens=0) == 40  # no prefill: all that is left
    assert order.decode_budget(40, num_prefill_tokens=10) == 40  # 64 - cap 16 = 48 > 40
    assert order.decode_budget(30, num_prefill_tokens=10) == 30
    assert order.decode_budget(30, num_prefill_tokens=54) == 10  # prefill over the cap
    whole = make_budget_order("prefill_first", SchedulerConfig(
        max_num_batched_tokens=64, long_prefill_token_threshold=64, max_model_len=64))
    assert whole.decode_budget(60, num_prefill_tokens=4) == 0  # the mixed-pool incident


def held(n_blocks: int = 8, num_cpu_blocks: int = 0, count: int = 1, prompt_len: int = 8):
    """A KV manager and `count` requests, each with its prompt computed in 4-token blocks."""
    kv = KVCacheManager(n_blocks, 4, num_cpu_blocks)
    reqs = make_requests(count, prompt_len=prompt_len)
    for r in reqs:
        assert kv.allocate_slots(r, prompt_len)
        r.num_computed_tokens = prompt_len
    return kv, reqs


def test_only_preemption_none_reserves_the_worst_case():
    assert [m.reserves_worst_case for m in (Recompute, Swap, NoPreemption)] == \
        [False, False, True]


def test_recompute_drops_the_kv_and_restarts_from_zero():
    kv, (req,) = held()
    out = SchedulerOutput(step_index=0)
    assert Recompute().evict(req, kv, out) is RequestStatus.PREEMPTED
    assert req.num_computed_tokens == 0 and req.num_recomputed_tokens == 8
    assert kv.block_table(req.request_id) == [] and not out.swap_out
    kv.check_integrity()


def test_swap_copies_to_the_cpu_pool_and_recomputes_when_it_is_full():
    kv, (a, b) = held(num_cpu_blocks=2, count=2)
    out = SchedulerOutput(step_index=0)
    assert Swap().evict(a, kv, out) is RequestStatus.SWAPPED
    assert len(out.swap_out) == 2 and a.num_swapped_out_blocks == 2
    assert a.num_computed_tokens == 8  # progress kept
    assert Swap().evict(b, kv, out) is RequestStatus.PREEMPTED  # no CPU room left
    assert b.num_computed_tokens == 0 and len(out.swap_out) == 2
    kv.check_integrity()


def test_preemption_none_refuses_to_evict_and_changes_nothing():
    kv, (req,) = held()
    out = SchedulerOutput(step_index=0)
    with pytest.raises(RuntimeError, match="preemption_mode=none"):
        NoPreemption().evict(req, kv, out)
    assert len(kv.block_table(req.request_id)) == 2 and req.num_computed_tokens == 8
    assert not out.swap_out
