"""A class's `multi_turn` block: read from YAML and written back, each arrival opening a
session whose turns follow it with growing prompts, and every bad value refused in the
one shape (`field = value: must be ...`) naming its place in the file."""

from __future__ import annotations

import pytest

from stepserve.config.limits import MAX_LEN, MAX_NUM_REQUESTS
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import workload_from_dict, workload_to_dict
from stepserve.workload.sessions import MAX_THINK_S, MAX_TURNS, next_turns, session_starts


def body(multi_turn, num=4, **cls):
    return {"seed": 2, "num_requests": num, "arrival": {"poisson": {"rate": 2.0}},
            "classes": [{"name": "chat", "prompt": {"uniform": [30, 60]},
                         "output": {"uniform": [5, 20]}, "multi_turn": multi_turn, **cls}]}


def test_each_arrival_opens_a_session_of_growing_turns():
    w = workload_from_dict(body({"turns": 3, "think_time_s": {"uniform": [1, 2]},
                                 "user_len": 10}))
    specs = w.generate()
    assert len(specs) == 12 and [s.index for s in specs] == list(range(12))
    assert [s.turn for s in specs] == [0, 1, 2] * 4
    assert session_starts(specs) == [0, 3, 6, 9]
    for k, nxt in next_turns(specs).items():
        before, after = specs[k], specs[nxt]
        assert after.session == before.session == specs[before.session].index
        assert after.arrival_s == before.arrival_s  # a lower bound: sent when k ended
        assert after.history_len == before.prompt_len + before.output_len
        assert after.prompt_len == after.history_len + 10
        assert 1 <= after.think_time_s <= 2
    assert w.generate() == specs


def test_a_session_of_one_turn_is_a_plain_request_and_user_len_defaults_to_the_prompt():
    one = workload_from_dict(body({"turns": 1})).generate()
    plain = workload_from_dict({**body({"turns": 1}), "classes": [
        {k: v for k, v in body({})["classes"][0].items() if k != "multi_turn"}]}).generate()
    assert [(s.prompt_len, s.output_len, s.arrival_s) for s in one] == \
        [(s.prompt_len, s.output_len, s.arrival_s) for s in plain]
    specs = workload_from_dict(body({"turns": 2})).generate()
    assert all(30 <= s.prompt_len - s.history_len <= 60 for s in specs)


@pytest.mark.parametrize("think", [0, 2.5, {"fixed": 1}, {"uniform": [0.5, 3]},
                                   {"exponential": {"mean": 4}}])
def test_the_block_is_written_back_as_it_was_read(think):
    w = workload_from_dict(body({"turns": {"uniform": [1, 4]}, "think_time_s": think,
                                 "user_len": {"fixed": 12}}, shared_prefixes=2,
                                prefix_len=16))
    assert workload_from_dict(workload_to_dict(w)) == w
    assert "sessions of uniform" in w.describe()


@pytest.mark.parametrize("multi_turn, message", [
    ({"turns": 0}, "classes[0].multi_turn.turns.fixed = 0: must be an integer in [1, "),
    ({"turns": 2.5}, "classes[0].multi_turn.turns = 2.5: must be a mapping"),
    ({"turns": MAX_TURNS + 1},
     f"classes[0].multi_turn.turns (mean) = {MAX_TURNS + 1}: must be a finite number in "
     f"[1, {MAX_TURNS}]"),
    ({"turns": 2, "think_time_s": -1},
     f"classes[0].multi_turn.think_time_s.fixed = -1: must be a finite number in "
     f"[0, {MAX_THINK_S:g}]"),
    ({"turns": 2, "think_time_s": {"uniform": [3, 1]}},
     "classes[0].multi_turn.think_time_s.uniform[1] = 1: must be a finite number in [3, "),
    ({"turns": 2, "think_time_s": {"exponential": {"mean": float("nan")}}},
     "classes[0].multi_turn.think_time_s.exponential = nan: must be a finite number"),
    ({"turns": 2, "think_time_s": {"poisson": 1}},
     "classes[0].multi_turn.think_time_s: unknown key 'poisson'; allowed keys: fixed, "),
    ({"turns": 2, "think_time_s": "5s"}, "classes[0].multi_turn.think_time_s = '5s': must be"),
    ({"turns": 2, "user_len": 0}, "classes[0].multi_turn.user_len.fixed = 0: must be an "
                                  "integer in [1, "),
    ({"turns": 2, "rounds": 3}, "classes[0].multi_turn: unknown key 'rounds'; allowed keys: "
                                "turns, think_time_s, user_len"),
    ({"think_time_s": 1}, "classes[0].multi_turn: missing required key 'turns'"),
    (3, "classes[0].multi_turn = 3: must be a mapping with keys turns, think_time_s"),
])
def test_bad_blocks_are_refused_in_the_one_shape(multi_turn, message):
    with pytest.raises(WorkloadError) as e:
        workload_from_dict(body(multi_turn))
    assert str(e.value).startswith(message), str(e.value)


def test_sessions_times_turns_stay_within_the_request_bound():
    with pytest.raises(WorkloadError, match=f"at most {MAX_NUM_REQUESTS:,}"):
        workload_from_dict(body({"turns": 100}, num=MAX_NUM_REQUESTS // 50))


def test_a_session_ends_before_a_prompt_longer_than_max_len():
    w = workload_from_dict({**body({"turns": 3}, num=1), "classes": [
        {"name": "long", "prompt": 400_000, "output": 1000,
         "multi_turn": {"turns": 3, "user_len": 400_000}}]})
    specs = w.generate()
    # turn 2 holds 801,000 tokens; turn 3 would hold 1,202,000
    assert [s.prompt_len for s in specs] == [400_000, 801_000] and MAX_LEN < 1_202_000
