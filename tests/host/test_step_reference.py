"""The quiet step-time reference per step shape and N (recent time over quiet time), on
synthetic step records."""

from __future__ import annotations

import pytest

from stepserve.core.output import StepRecord
from stepserve.host.step_reference import (
    QuietStepReference,
    power_of_two_bucket,
    shape_of,
    step_time_over_quiet,
)


def step(duration_s: float, decode: int = 1, prefill: int = 0) -> StepRecord:
    return StepRecord(index=0, start_s=0.0, duration_s=duration_s,
                      num_prefill_tokens=prefill, num_decode_tokens=decode,
                      num_scheduled_seqs=max(decode, 1), num_decode_ready=decode,
                      num_running=decode, num_waiting=0, num_swapped=0, num_preempted=0,
                      kv_usage=0.1, slots_held=decode, num_active=decode)


def test_shapes_are_powers_of_two():
    assert [power_of_two_bucket(n) for n in (0, 1, 2, 3, 5, 8, 9)] == [0, 1, 2, 4, 8, 8, 16]
    assert shape_of(step(0.01, decode=3, prefill=100)) == (4, 128)


def test_a_quiet_run_takes_its_quiet_time():
    steps = [step(0.012 + 0.0001 * (i % 5)) for i in range(100)]
    assert step_time_over_quiet(steps) == pytest.approx(1.0, abs=0.06)


def test_contention_after_a_quiet_start_shows_as_n():
    ref = QuietStepReference(window=50)
    ref.add_all(step(0.012) for _ in range(100))  # quiet: 12 ms decode steps
    assert ref.reference_s((1, 0)) == pytest.approx(0.012, rel=0.03)
    ref.add_all(step(0.036) for _ in range(50))  # contended: 3x slower
    assert ref.reference_s((1, 0)) == pytest.approx(0.012, rel=0.03)  # the fast end stays
    assert ref.over_quiet() == pytest.approx(3.0, rel=0.05)


def test_each_shape_against_its_own_reference():
    ref = QuietStepReference()
    for _ in range(20):
        ref.add(step(0.010, decode=1))
        ref.add(step(0.200, decode=0, prefill=512))
    assert ref.over_quiet() == pytest.approx(1.0, rel=0.05)  # big steps are not slow ones
    ref.add(step(0.400, decode=0, prefill=500))  # one prefill step twice its quiet time
    over = ref.over_quiet()
    assert over is not None and over > 1.0


def test_no_reference_before_enough_steps_of_a_shape():
    ref = QuietStepReference(min_steps=8)
    ref.add_all(step(0.01) for _ in range(7))
    assert ref.reference_s((1, 0)) is None and ref.over_quiet() is None
    ref.add(step(0.01))
    assert ref.over_quiet() == pytest.approx(1.0, rel=0.05)


def test_contended_from_the_start_understates():
    """Every step slow from the first: no quiet steps to compare with, so N reads about 1
    (the docs say so; the run-queue wait and the others' CPU say it directly)."""
    assert step_time_over_quiet([step(0.036) for _ in range(100)]) == pytest.approx(
        1.0, rel=0.05)
    assert step_time_over_quiet([]) is None
