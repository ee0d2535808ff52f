"""The starvation guard is on by default for every policy that reorders: with hot
traffic that never stops and a cold request that every hot one outranks, the cold one
still starts within the guard's bound; with the guard off it would wait for ever."""

from __future__ import annotations

import itertools

import pytest

from stepserve.config.settings import QueueConfig
from tests.factories import make_requests, make_scheduler, step

HOT_PREFIX = list(range(1000, 1032))  # 32 tokens: 8 full blocks of 4, cached by the first
GUARD_S = QueueConfig().aging_after_s
HORIZON_S = 3 * GUARD_S  # far past the bound: a starved request is still waiting here


def _cold_and_hot(policy):
    """The cold request and a maker of hot ones, each outranked by every hot one."""
    if policy == "lpm":
        cold = make_requests(1, prompt_len=40, max_tokens=1, prefix="cold")[0]
        suffix = itertools.count(5000)
        return cold, lambda name, now: make_requests(
            1, max_tokens=1, prompt=HOT_PREFIX + [next(suffix)], prefix=name, arrival=now)[0]
    if policy == "srpt":  # the cold one has the most output left
        cold = make_requests(1, max_tokens=64, prefix="cold")[0]
        return cold, lambda name, now: make_requests(1, max_tokens=1, prefix=name,
                                                     arrival=now)[0]
    cold = make_requests(1, max_tokens=1, prefix="cold", priority=1)[0]  # priority
    return cold, lambda name, now: make_requests(1, max_tokens=1, prefix=name,
                                                 arrival=now)[0]


def _cold_wait(policy, **settings):
    """Seconds the cold request waited for its first step while two hot ones always
    wait beside it (None: it had not started by HORIZON_S)."""
    sched = make_scheduler(block_size=4, max_model_len=128, policy=policy, max_num_seqs=1,
                           **settings)
    cold, hot = _cold_and_hot(policy)
    names = (f"hot{i}-" for i in itertools.count())
    sched.add_request(hot(next(names), sched.clock.now()))  # warms the hot prefix
    step(sched)
    cold.arrival_time = sched.clock.now()
    sched.add_request(cold)
    while sched.clock.now() - cold.arrival_time < HORIZON_S:
        while sum(r is not cold for r in sched.waiting) < 2:  # the hot load never stops
            sched.add_request(hot(next(names), sched.clock.now()))
        step(sched)
        if cold.first_scheduled_time is not None:
            return cold.first_scheduled_time - cold.arrival_time
    return None


@pytest.mark.parametrize("policy", ["lpm", "srpt", "priority"])
def test_a_cold_request_starts_within_the_default_guard_under_endless_hot_load(policy):
    wait = _cold_wait(policy)
    assert wait is not None and GUARD_S <= wait <= GUARD_S + 0.5, wait


@pytest.mark.parametrize("policy", ["lpm", "srpt", "priority"])
def test_without_the_guard_the_same_cold_request_starves(policy):
    assert _cold_wait(policy, aging_after_s=0.0) is None


def test_the_guard_is_on_by_default_and_bounded():
    assert 0 < GUARD_S <= 60
