"""The threads a step runs on: the user's count as given, else the cores the team really
gets (host/step_threads.py); the canary that asks whether one more thread would get a
core, and the thread policy asking it instead of trying the team's extra thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepserve.host.cpu_share import CpuReading
from stepserve.host.step_threads import (
    KEPT_S,
    PROBE_FIRST_S,
    WINDOW_S,
    Canary,
    StepThreads,
    canary_wait_share,
)


class Host:
    """Cumulative CPU readings, advanced a window at a time by the test."""

    def __init__(self, usable: int = 2) -> None:
        self.now = 0.0
        self.usable = usable
        self.others = self.nice = self.on = self.wait = 0.0
        self.readable = True

    def clock(self) -> float:
        return self.now

    def read(self) -> CpuReading:
        if not self.readable:
            return CpuReading(self.now, None, None, None, None, self.usable, None)
        return CpuReading(self.now, self.wait, self.on, self.others, 0.0, self.usable,
                          self.nice)

    def window(self, policy: StepThreads, others: float = 0.0, nice: float = 0.0,
               wait_share: float = 0.01, seconds: float = 0.5) -> int:
        """Others keep `others` cores busy (and niced work `nice`) for `seconds`, the
        team's threads wait `wait_share` of their time; then a step asks."""
        self.now += seconds
        self.others += others * seconds
        self.nice += nice * seconds
        team = policy.choice.threads * seconds
        self.on += team * (1 - wait_share)
        self.wait += team * wait_share
        return policy.threads()


def make(ceiling: int = 2, usable: int = 2, fixed: int | None = None):
    host = Host(usable)
    policy = StepThreads(ceiling, usable, fixed, host.read, host.clock)
    assert policy.threads() == (fixed or ceiling)  # the first call only marks the window
    return policy, host


def test_a_busy_process_takes_a_thread_and_its_end_gives_it_back():
    policy, host = make()
    assert host.window(policy, others=0.02) == 2      # quiet: both cores
    assert host.window(policy, others=0.67, wait_share=0.35) == 1  # its fair share
    assert host.window(policy, others=1.0) == 1       # then all of the other core
    assert host.window(policy, others=0.0) == 2       # it ended
    assert policy.choice.changes == 2


def test_a_light_neighbour_leaves_the_team_whole():
    policy, host = make()
    for _ in range(5):  # a benchmark client's share of a core
        assert host.window(policy, others=0.3, wait_share=0.05) == 2
    assert host.window(policy, others=0.7) == 1
    # 0.3 busy: 1.7 free, not an idle core (1.75), but the crowd that took the thread
    # is gone: it comes back
    assert host.window(policy, others=0.3) == 2
    assert host.window(policy, others=0.1) == 2


def test_the_team_waiting_for_its_cores_loses_a_thread_whoever_holds_them():
    policy, host = make()
    # niced work in another autogroup: /proc/stat calls it nice, yet it takes a core
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1


def windows_until_probe(host: Host, policy: StepThreads, **load) -> int:
    """Windows under `load` until the policy tries one more thread."""
    for n in range(1, 1000):
        if host.window(policy, **load) > 1:
            return n
    raise AssertionError("never probed")


def test_a_core_only_niced_work_holds_is_probed_and_kept_when_the_team_gets_it():
    policy, host = make()
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    # PROBE_FIRST_S later: the probe
    assert windows_until_probe(host, policy, nice=1.0) == PROBE_FIRST_S / WINDOW_S
    assert host.window(policy, nice=0.02) == 2  # kept: the team preempts the niced work
    assert host.window(policy, nice=0.02) == 2


def test_a_failed_probe_backs_off_twice_as_long_each_time():
    policy, host = make()
    host.window(policy, nice=1.0, wait_share=0.5)
    probes = []
    for _ in range(80):  # 40 s with the niced work holding its core from another group
        threads = host.window(policy, nice=1.0, wait_share=0.5 if policy.choice.threads
                              == 2 else 0.0)
        probes.append(threads)
    starts = [i for i, (a, b) in enumerate(zip([1, *probes], probes, strict=False))
              if a == 1 and b == 2]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(starts) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]
    assert probes.count(2) == len(starts)  # each probe one window long


def test_a_light_neighbour_after_a_burst_gets_the_thread_back_by_a_probe():
    policy, host = make()
    assert host.window(policy, others=1.0) == 1  # a benchmark client starting up
    for _ in range(4):  # two more seconds of its imports
        assert host.window(policy, others=1.0) == 1
    # then its steady 0.3 of a core: 1.7 free is no idle core, but no reason to shrink;
    # the burst that took the thread has passed, so the thread comes back at once
    assert host.window(policy, others=0.3) == 2
    for _ in range(20):
        assert host.window(policy, others=0.3, wait_share=0.05) == 2  # kept
    assert host.window(policy, others=0.7) == 1  # a second burst, later
    assert host.window(policy, others=0.3) == 2


def test_a_neighbour_near_the_line_does_not_flip_the_team_every_window():
    policy, host = make()
    counts = [host.window(policy, others=0.55 if i % 2 else 0.45) for i in range(120)]
    flips = sum(a != b for a, b in zip(counts, counts[1:], strict=False))
    assert flips <= 12, counts  # the backoff: each regrow waits twice as long


def test_a_busy_process_at_normal_priority_is_never_probed():
    policy, host = make()
    assert host.window(policy, others=0.67, wait_share=0.35) == 1
    for _ in range(400):  # 200 s
        assert host.window(policy, others=1.0) == 1
    assert policy.choice.changes == 1


def test_a_probe_that_held_a_window_and_then_waited_still_backs_off():
    policy, host = make()
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    assert windows_until_probe(host, policy, nice=1.0) == PROBE_FIRST_S / WINDOW_S
    assert host.window(policy, nice=0.0) == 2  # the niced work paused for a window
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1  # back, and the team waits
    # the count held less than KEPT_S: the next probe waits twice as long
    assert windows_until_probe(host, policy, nice=1.0) == 2 * PROBE_FIRST_S / WINDOW_S
    for _ in range(int(KEPT_S / WINDOW_S)):  # a probe that holds KEPT_S ...
        assert host.window(policy, nice=0.0) == 2
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    # ... was right: the backoff starts over
    assert windows_until_probe(host, policy, nice=1.0) == PROBE_FIRST_S / WINDOW_S


def test_steps_between_windows_keep_the_choice_and_read_nothing():
    policy, host = make()
    host.window(policy, others=1.0)
    host.readable = False  # a read now would change nothing: none happens
    host.now += 0.1
    assert policy.threads() == 1


def test_on_many_cores_the_free_ones_count_up_to_the_ceiling():
    policy, host = make(ceiling=8, usable=16)
    assert host.window(policy, others=6.0) == 8
    for expected in (7, 6, 5, 4, 4):  # a thread a window, down to the free cores
        assert host.window(policy, others=12.0) == expected
    assert host.window(policy, others=2.0) == 5


def test_a_fixed_count_is_kept_whatever_the_load():
    policy, host = make(fixed=2)
    assert not policy.adaptive
    assert host.window(policy, others=1.0, wait_share=0.5) == 2


def test_unreadable_counters_keep_the_choice():
    policy, host = make()
    host.readable = False
    assert host.window(policy, others=1.0, wait_share=0.5) == 2


def glancing(others_now: list[int | None], ceiling: int = 2, usable: int = 2):
    """A policy whose first look sees others_now[i] runnable threads of others the i-th
    time it looks."""
    host = Host(usable)
    looks = iter(others_now)
    policy = StepThreads(ceiling, usable, None, host.read, host.clock,
                         glance=lambda: next(looks))
    return policy, host


def test_a_busy_neighbour_takes_a_thread_before_the_first_step():
    policy, host = glancing([1])
    assert policy.threads() == 1  # not a whole first step on a core it cannot get
    assert host.window(policy, others=1.0) == 1  # the windows after agree
    assert host.window(policy, others=0.0) == 2  # it ended: the idle core back


def test_a_quiet_first_look_keeps_the_team():
    policy, host = glancing([0])
    assert policy.threads() == 2
    assert host.window(policy, others=0.02) == 2
    many, _ = glancing([3], ceiling=8, usable=16)
    assert many.threads() == 8  # 13 cores left for 8 threads
    crowded, _ = glancing([15], ceiling=8, usable=16)
    assert crowded.threads() == 1  # never none


def test_after_an_idle_spell_the_team_looks_again_instead_of_averaging_it():
    policy, host = glancing([0, 1])
    assert policy.threads() == 2
    # ten idle seconds, a busy loop in the last of them: the window would say 0.1 cores
    assert host.window(policy, others=0.1, seconds=10.0) == 1


def test_an_unreadable_first_look_keeps_the_team():
    policy, host = glancing([None])
    assert policy.threads() == 2


class FakeCanary(Canary):
    """Answers at once (on the caller's thread) with `share`; counts the questions."""

    def __init__(self, share: float | None) -> None:
        self.share, self.asked = share, 0
        super().__init__(self._answer, spawn=lambda work: work())

    def _answer(self) -> float | None:
        self.asked += 1
        return self.share


def make_with_canary(share: float | None):
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
    policy, host, canary = make_with_canary(share=0.5)
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    counts = [host.window(policy, nice=1.0) for _ in range(240)]  # 2 minutes
    assert set(counts) == {1}  # the team never tried its second thread
    assert 3 <= canary.asked <= 7  # asked after 2 s, then twice as long each time


def test_niced_work_that_yields_gives_the_core_back_and_keeps_it():
    # a nice-19 loop in the engine's own session: the canary gets the core
    policy, host, canary = make_with_canary(share=0.01)
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
