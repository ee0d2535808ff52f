"""The threads a step runs on: the user's count as given, else the cores other
processes leave free (engine/step_threads.py)."""

from __future__ import annotations

from stepserve.engine.step_threads import StepThreads


class Others:
    """Cumulative CPU seconds of other processes, advanced by the test."""

    def __init__(self) -> None:
        self.total = 0.0
        self.readable = True

    def __call__(self) -> float | None:
        return self.total if self.readable else None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_window(policy: StepThreads, clock: Clock, others: Others, cores_busy: float,
               seconds: float = 0.5) -> int:
    """Other processes keep `cores_busy` cores busy for `seconds`; then a step asks."""
    clock.now += seconds
    others.total += cores_busy * seconds
    return policy.threads()


def make(ceiling: int = 2, usable: int = 2, fixed: int | None = None):
    clock, others = Clock(), Others()
    policy = StepThreads(ceiling, usable, fixed, others, clock)
    assert policy.threads() == (fixed or ceiling)  # the first call only marks the window
    return policy, clock, others


def test_a_busy_process_takes_a_thread_and_its_end_gives_it_back():
    policy, clock, others = make()
    assert run_window(policy, clock, others, 0.02) == 2     # quiet: both cores
    assert run_window(policy, clock, others, 0.67) == 1     # its fair share beside 2 threads
    assert run_window(policy, clock, others, 1.0) == 1      # then all of the other core
    assert run_window(policy, clock, others, 0.0) == 2      # it ended
    assert policy.choice.changes == 2


def test_a_light_neighbour_leaves_the_team_whole_and_a_near_threshold_one_does_not_flip_it():
    policy, clock, others = make()
    for _ in range(5):  # a benchmark client's share of a core
        assert run_window(policy, clock, others, 0.3) == 2
    assert run_window(policy, clock, others, 0.7) == 1
    # 0.3 busy: 1.7 free, not yet the 1.85 a thread comes back at
    assert run_window(policy, clock, others, 0.3) == 1
    assert run_window(policy, clock, others, 0.1) == 2


def test_steps_between_windows_keep_the_choice_and_read_nothing():
    policy, clock, others = make()
    run_window(policy, clock, others, 1.0)
    others.readable = False  # a read now would keep the ceiling (None): none happens
    clock.now += 0.1
    others.total += 100.0
    assert policy.threads() == 1


def test_on_many_cores_the_free_ones_count_up_to_the_ceiling():
    policy, clock, others = make(ceiling=8, usable=16)
    assert run_window(policy, clock, others, 6.0) == 8
    assert run_window(policy, clock, others, 12.0) == 4
    assert run_window(policy, clock, others, 16.0) == 1  # never none


def test_a_fixed_count_is_kept_whatever_the_load():
    policy, clock, others = make(fixed=2)
    assert not policy.adaptive
    assert run_window(policy, clock, others, 1.0) == 2


def test_unreadable_counters_keep_the_ceiling():
    policy, clock, others = make()
    others.readable = False
    assert run_window(policy, clock, others, 1.0) == 2

