import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepserve.plan.speedup import parse_group, speedup, speedup_for_lengths


def test_seed_64_way_nightly_report():
    r = speedup([(10, 2000), (54, 20)], 64)
    assert r.static_steps == 2000
    assert r.useful_tokens == 21_080
    assert r.slot_utilization == pytest.approx(21_080 / 128_000)
    assert round(r.slot_utilization * 100, 1) == 16.5
    assert r.ideal_steps == pytest.approx(329.375)
    assert round(r.ideal_steps, 1) == 329.4
    assert round(r.speedup_cap, 1) == 6.1
    assert r.num_batches == 1
    assert r.longest_request_steps == 2000


def test_seed_ten_way_one_long_request():
    r = speedup([(9, 20), (1, 2000)], 10)
    assert r.static_steps == 2000
    assert r.useful_tokens == 2180
    assert r.slot_utilization == pytest.approx(0.109)
    assert r.ideal_steps == pytest.approx(218.0)
    assert r.speedup_cap == pytest.approx(20_000 / 2180)  # 9.17, "about 9x" by hand
    assert r.idle_slot_steps == 20_000 - 2180


def test_seed_abcd_four_way():
    r = speedup([(1, 20), (1, 50), (1, 30), (1, 200)], 4)
    assert r.static_steps == 200
    assert r.useful_tokens == 300
    assert r.slot_utilization == pytest.approx(0.375)
    assert r.speedup_cap == pytest.approx(800 / 300)  # 2.67, "about 2.7x" by hand
    assert speedup_for_lengths([20, 50, 30, 200], 4) == r


def test_batches_are_filled_in_the_order_given():
    # 10 long then 54 short at 8 slots: batch 0 all long, batch 1 = 2 long + 6 short,
    # batches 2-7 all short.
    r = speedup([(10, 2000), (54, 20)], 8)
    assert r.num_batches == 8
    assert r.static_steps == 2000 + 2000 + 6 * 20
    rows = [
        (b.first_batch, b.num_batches, b.num_requests, b.steps, b.useful_tokens) for b in r.batches
    ]
    assert rows == [(0, 1, 8, 2000, 16_000), (1, 1, 8, 2000, 4120), (2, 6, 8, 20, 160)]
    # The same requests short-first: the longs share batches, fewer static steps.
    assert speedup([(54, 20), (10, 2000)], 8).static_steps == 6 * 20 + 2000 + 2000


def test_partial_last_batch_counts_empty_slots_idle():
    r = speedup([(5, 100)], 4)
    assert r.num_batches == 2
    assert r.static_steps == 200
    assert r.batches[-1].num_requests == 1
    assert r.slot_utilization == pytest.approx(500 / 800)
    assert r.longest_request_steps == 100


def test_huge_counts_do_not_expand():
    r = speedup([(10**9, 20), (1, 2000)], 64)
    assert r.num_batches == math.ceil((10**9 + 1) / 64)
    assert len(r.batches) <= 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10x2000", (10, 2000)),
        ("54X20", (54, 20)),
        (" 1 x 200 ", (1, 200)),
        ("9\u00d720", (9, 20)),
        ("3*7", (3, 7)),
    ],
)
def test_parse_group(text, expected):
    assert parse_group(text) == expected


@pytest.mark.parametrize(
    "text", ["10", "x2000", "10x", "10x20x3", "ten x 20", "-1x20", "1.5x20", "0x20", "10x0", ""]
)
def test_parse_group_rejects(text):
    with pytest.raises(ValueError, match="group"):
        parse_group(text)


@pytest.mark.parametrize(
    ("groups", "concurrency"),
    [
        ([], 4),
        ([(0, 10)], 4),
        ([(1, 0)], 4),
        ([(1, 10)], 0),
        ([(1, 10)], -2),
        ([(1, 10)], 2.0),
        ([(1.5, 10)], 4),
        ([(1, 10, 3)], 4),
        ([(True, 10)], 4),
    ],
)
def test_speedup_rejects(groups, concurrency):
    with pytest.raises(ValueError):
        speedup(groups, concurrency)


def test_speedup_for_lengths_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        speedup_for_lengths([], 4)


groups_strategy = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 3000)), min_size=1, max_size=6
)


@given(groups_strategy, st.integers(1, 100))
def test_invariants(groups, concurrency):
    r = speedup(groups, concurrency)
    assert 0 < r.slot_utilization <= 1
    assert r.speedup_cap >= 1
    assert r.speedup_cap == pytest.approx(1 / r.slot_utilization)
    assert r.static_steps >= r.longest_request_steps
    assert r.static_steps >= r.ideal_steps
    lengths = [length for count, length in groups for _ in range(count)]
    assert r.num_requests == len(lengths)
    assert r.useful_tokens == sum(lengths)
    # Reference: expand the requests and cut them into batches in order.
    chunks = [lengths[i : i + concurrency] for i in range(0, len(lengths), concurrency)]
    assert r.num_batches == len(chunks)
    assert r.static_steps == sum(max(chunk) for chunk in chunks)
    assert sum(b.num_batches for b in r.batches) == r.num_batches
    assert sum(b.num_batches * b.steps for b in r.batches) == r.static_steps
    assert sum(b.num_batches * b.num_requests for b in r.batches) == r.num_requests
    assert speedup_for_lengths(lengths, concurrency).static_steps == r.static_steps


@given(st.integers(1, 50), st.integers(1, 5000), st.integers(1, 100))
def test_equal_lengths_full_batches_have_no_gain(batches, length, concurrency):
    r = speedup([(batches * concurrency, length)], concurrency)
    assert r.slot_utilization == 1.0
    assert r.speedup_cap == 1.0
    assert r.ideal_steps == r.static_steps


@given(st.integers(1, 500), st.integers(1, 5000), st.integers(1, 100))
def test_equal_lengths_only_the_partial_batch_idles(count, length, concurrency):
    r = speedup([(count, length)], concurrency)
    assert r.speedup_cap == pytest.approx(concurrency * r.num_batches / count)
    assert r.idle_slot_steps == (concurrency * r.num_batches - count) * length
