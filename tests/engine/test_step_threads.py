"""The threads a step runs on: the user's count as given, else the cores the team really
gets (engine/step_threads.py)."""

from __future__ import annotations

from stepserve.engine.cpu_share import CpuReading
from stepserve.engine.step_threads import PROBE_FIRST_S, StepThreads


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


def test_a_light_neighbour_leaves_the_team_whole_and_a_near_threshold_one_does_not_flip_it():
    policy, host = make()
    for _ in range(5):  # a benchmark client's share of a core
        assert host.window(policy, others=0.3, wait_share=0.05) == 2
    assert host.window(policy, others=0.7) == 1
    # 0.3 busy: 1.7 free, not yet the 1.75 a thread comes back at
    assert host.window(policy, others=0.3) == 1
    assert host.window(policy, others=0.1) == 2


def test_the_team_waiting_for_its_cores_loses_a_thread_whoever_holds_them():
    policy, host = make()
    # niced work in another autogroup: /proc/stat calls it nice, yet it takes a core
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1


def test_a_core_only_niced_work_holds_is_probed_and_kept_when_the_team_gets_it():
    policy, host = make()
    assert host.window(policy, nice=1.0, wait_share=0.5) == 1
    assert host.window(policy, nice=1.0) == 1  # too soon to probe
    host.now += PROBE_FIRST_S
    assert host.window(policy, nice=1.0) == 2  # the probe
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
