"""Offline `LLM` refuses what vLLM's refuses instead of quietly changing it: a
max_model_len above the model's, a priority under a policy that ignores priorities."""

from __future__ import annotations

import pytest

from stepserve import LLM, SamplingParams
from stepserve.core.request_limits import priority_refusal

TINY_LIMIT = 4096  # the tiny preset's max_position_embeddings


def greedy(n: int = 4) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_max_model_len_above_the_models_is_an_error_naming_both():
    with pytest.raises(ValueError) as info:
        LLM("tiny", max_model_len=TINY_LIMIT + 904)
    message = str(info.value)
    assert "5000" in message and str(TINY_LIMIT) in message
    assert "max_position_embeddings" in message
    # vLLM's spelling of the setting is refused the same way
    with pytest.raises(ValueError, match="5000"):
        LLM("tiny", **{"max-model-len": 5000})


def test_max_model_len_at_the_models_limit_and_the_default_are_taken():
    assert LLM("tiny", max_model_len=TINY_LIMIT).engine.config.scheduler.max_model_len \
        == TINY_LIMIT
    assert LLM("tiny").engine.config.scheduler.max_model_len <= TINY_LIMIT


@pytest.fixture(scope="module")
def fcfs():
    return LLM("tiny", max_model_len=128, max_num_seqs=4, scheduling_policy="fcfs")


def test_priority_under_fcfs_is_a_value_error_and_nothing_runs(fcfs):
    with pytest.raises(ValueError) as info:
        fcfs.generate(["a", "b"], greedy(), use_tqdm=False, priority=[1, 0])
    assert str(info.value) == priority_refusal(1, "fcfs")
    assert "'fcfs'" in str(info.value) and "priority = 1" in str(info.value)
    assert not fcfs.engine.has_unfinished() and fcfs.scheduler.kv.all_free
    # a priority carried in the sampling params is refused the same way
    with pytest.raises(ValueError, match="'fcfs'"):
        fcfs.generate("a", SamplingParams(max_tokens=2, priority=-2), use_tqdm=False)
    # all-default priorities are fine, as on the server
    outs = fcfs.generate(["a", "b"], greedy(), use_tqdm=False, priority=[0, 0])
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4]


def test_priority_list_must_match_the_prompts(fcfs):
    with pytest.raises(ValueError, match="2 prompts but 3 priorities"):
        fcfs.generate(["a", "b"], greedy(), use_tqdm=False, priority=[0, 0, 0])


def test_priority_under_the_priority_policy_orders_the_queue():
    llm = LLM("tiny", max_model_len=128, max_num_seqs=1, scheduling_policy="priority")
    outs = llm.generate(["first in", "second in", "third in"], greedy(6), use_tqdm=False,
                        priority=[5, 0, 9])
    assert [o.prompt for o in outs] == ["first in", "second in", "third in"]
    # one sequence at a time: the lowest priority value is served first
    order = sorted(range(3), key=lambda k: outs[k].metrics.first_token_time)
    assert order == [1, 0, 2]


def test_priority_refusal_is_the_servers_check():
    assert priority_refusal(0, "fcfs") is None
    assert priority_refusal(7, "priority") is None
    assert "--scheduling-policy priority" in priority_refusal(3, "srpt")
