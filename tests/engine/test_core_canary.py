"""The canary that asks whether one more thread would get a core (engine/core_canary.py),
and the thread policy asking it instead of trying the team's extra thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_step_threads import Host, windows_until_probe  # noqa: E402

from stepserve.engine.core_canary import Canary, canary_wait_share  # noqa: E402
from stepserve.engine.step_threads import PROBE_FIRST_S, WINDOW_S, StepThreads  # noqa: E402


class FakeCanary(Canary):
    """Answers at once (on the caller's thread) with `share`; counts the questions."""

    def __init__(self, share: float | None) -> None:
        self.share, self.asked = share, 0
        super().__init__(self._answer, spawn=lambda work: work())

    def _answer(self) -> float | None:
        self.asked += 1
        return self.share


def make(share: float | None):
    host, canary = Host(), FakeCanary(share)
    policy = StepThreads(2, 2, None, host.read, host.clock, canary=canary)
    policy.threads()
    return policy, host, canary


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="no schedstat")
def test_the_canary_measures_its_own_wait():
    share = canary_wait_share(0.02)
    assert share is not None and 0.0 <= share <= 1.0


def test_without_schedstat_the_canary_says_nothing(tmp_path):
    assert canary_wait_share(0.001, str(tmp_path / "none")) is None


def test_a_canary_answers_once_and_a_failing_one_says_nothing():
    canary = FakeCanary(0.3)
    assert canary.take() == (False, None)
    canary.start()
    assert canary.take() == (True, 0.3) and canary.take() == (False, None)
    broken = Canary(lambda: 1 / 0, spawn=lambda work: work())
    broken.start()
    assert broken.take() == (True, None) and not broken.running


def test_niced_work_that_does_not_yield_costs_the_team_nothing_but_canaries():
    # a nice-19 loop in another session: the canary waits half its time
    policy, host, canary = make(share=0.5)
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    counts = [host.window(policy, nice=1.0) for _ in range(240)]  # 2 minutes
    assert set(counts) == {1}  # the team never tried its second thread
    assert 3 <= canary.asked <= 7  # asked after 2 s, then twice as long each time


def test_niced_work_that_yields_gives_the_core_back_and_keeps_it():
    # a nice-19 loop in the engine's own session: the canary gets the core
    policy, host, canary = make(share=0.01)
    # the first window after an idle spell: niced work holds a core, the team has not
    # waited yet (the window was mostly idle); niced work counts until shown to yield
    assert host.window(policy, nice=1.0, wait_share=0.0) == 1
    n = windows_until_probe(host, policy, nice=1.0)
    assert n == PROBE_FIRST_S / WINDOW_S + 1  # the canary, then its answer a window on
    for _ in range(20):
        assert host.window(policy, nice=1.0, wait_share=0.02) == 2
    assert canary.asked == 1
    # until the team waits after all: then niced work counts again
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    assert host.window(policy, nice=1.0) == 1
