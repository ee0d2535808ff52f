"""`threads` (--threads, YAML, LLM(threads=...)): the steps of a real engine run on the
count given, and without one on the count the free cores allow."""

from __future__ import annotations

import pytest
import torch

from stepserve import LLM, SamplingParams
from stepserve.config.errors import UsageError
from stepserve.host.cpu_share import CpuReading
from stepserve.host.step_threads import StepThreads

pytestmark = pytest.mark.xdist_group("torch_threads")


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def steps_on(llm: LLM) -> list[int]:
    """The thread count each step of a short generation ran on."""
    seen: list[int] = []
    runner = llm.engine.runner
    real = runner._forward_and_sample

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    runner._forward_and_sample = spy
    llm.generate(["hello there"], SamplingParams(max_tokens=4, temperature=0.0))
    return seen


def test_threads_setting_fixes_the_count_of_every_step():
    torch.set_num_threads(2)
    llm = LLM("tiny", max_model_len=64, threads=1)
    assert llm.engine.config.threads == 1
    seen = steps_on(llm)
    assert seen and set(seen) == {1}


def test_without_the_setting_busy_neighbours_lower_the_count():
    torch.set_num_threads(2)
    llm = LLM("tiny", max_model_len=64)
    assert llm.engine.step_threads.ceiling == 2
    ticks = iter(range(1000))
    policy_clock = [float(i) for i in range(1000)]

    def one_core_busy() -> CpuReading:  # a second a reading; others keep a core busy
        t = float(next(ticks))
        return CpuReading(t, 0.0, 2 * t, t, 0.0, 2, 0.0)

    policy = StepThreads(2, 2, None, one_core_busy, lambda: policy_clock.pop(0))
    llm.engine.runner.thread_count = policy.threads
    seen = steps_on(llm)
    assert seen[0] == 2 and seen[-1] == 1


def test_a_bad_count_is_refused_naming_the_setting():
    with pytest.raises(UsageError, match=r"threads = 0: must be an integer in \[1, 1024\]"):
        LLM("tiny", max_model_len=64, threads=0)
