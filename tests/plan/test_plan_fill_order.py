"""`plan speedup` when the requests need more than one static batch: the arrival order
changes the answer, so the order used is named and the range over every order given."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepserve.cli import main
from stepserve.plan.speedup import speedup, speedup_for_lengths

TOGETHER = [(20, 2000), (108, 20)]  # the long requests first: they share one batch
INTERLEAVED = [(10, 2000), (54, 20), (10, 2000), (54, 20)]  # one batch each half


def test_two_orders_of_the_same_requests_share_one_range():
    together, interleaved = speedup(TOGETHER, 64), speedup(INTERLEAVED, 64)
    assert round(together.speedup_cap, 2) == 3.07 and round(interleaved.speedup_cap, 2) == 6.07
    for r in (together, interleaved):
        assert r.order_sensitive
        assert (r.static_steps_min, r.static_steps_max) == (2020, 4000)
        assert round(r.speedup_cap_min, 2) == 3.07 and round(r.speedup_cap_max, 2) == 6.07
    assert speedup(INTERLEAVED, 64, "longest-first").static_steps == 2020


def test_a_single_batch_keeps_its_figures_and_needs_no_range():
    r = speedup([(10, 2000), (54, 20)], 64)
    assert round(r.slot_utilization * 100, 1) == 16.5 and round(r.speedup_cap, 1) == 6.1
    assert not r.order_sensitive
    assert r.static_steps_min == r.static_steps_max == r.static_steps == 2000
    assert r.speedup_cap_min == r.speedup_cap_max == r.speedup_cap


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=7), st.integers(1, 4))
def test_the_range_is_the_best_and_worst_of_every_order(lengths, concurrency):
    every = {speedup_for_lengths(list(order), concurrency).static_steps
             for order in itertools.permutations(lengths)}
    r = speedup_for_lengths(lengths, concurrency)
    assert (r.static_steps_min, r.static_steps_max) == (min(every), max(every))
    assert r.order_sensitive == (len(every) > 1)


def _cli(argv, capsys):
    code = main(["plan", "speedup", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_output_says_the_order_and_the_range(capsys):
    code, out, _ = _cli(["--group", "20x2000", "--group", "108x20", "--concurrency", "64"],
                        capsys)
    assert code == 0
    assert "filled in the order given" in out
    assert "2,020-4,000" in out and "3.07-6.07x" in out
    assert "the arrival order changes static steps and the cap" in out
    code, out, _ = _cli(["--group", "20x2000", "--group", "108x20", "--concurrency", "64",
                         "--order", "longest-first", "--json"], capsys)
    data = json.loads(out)
    assert data["fill_order"] == "longest-first" and data["static_steps"] == 2020
    assert data["static_steps_max"] == 4000 and data["order_sensitive"] is True
    for key in ("static_steps", "ideal_steps", "slot_utilization", "speedup_cap"):
        assert key in data
    code, out, _ = _cli(["--group", "10x2000", "--group", "54x20", "--concurrency", "64"],
                        capsys)
    assert "any order" not in out and "6.07x" in out


def test_help_says_requests_fill_batches_in_arrival_order(capsys):
    with pytest.raises(SystemExit) as done:
        main(["plan", "speedup", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "in arrival order" in out and "range over every order" in out
    assert "--order {given,longest-first}" in out
