"""A multi-turn workload's size is checked from the turn count's true second moment
before anything is generated, and what generation draws is capped as it goes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepserve.config.limits import MAX_WORKLOAD_TOKENS
from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import workload_from_dict

# one session in a hundred runs 1,000 turns: the mean turn count is 11, E[t(t-1)] ~10,000
HEAVY_TURNS = {"empirical": [1] * 99 + [1000]}


def body(turns, num, prompt=1000, output=1000, user=1000, seed=0):
    return {"seed": seed, "num_requests": num, "arrival": {"poisson": {"rate": 1.0}},
            "classes": [{"name": "chat", "prompt": {"fixed": prompt},
                         "output": {"fixed": output},
                         "multi_turn": {"turns": turns, "user_len": {"fixed": user}}}]}


def test_rare_long_sessions_are_refused_before_generation():
    # the mean turn count squared puts 100 of these at ~13 M tokens; they hold ~1 G
    with pytest.raises(WorkloadError, match=f"at most {MAX_WORKLOAD_TOKENS:,}"):
        workload_from_dict(body(HEAVY_TURNS, num=100))


def test_a_draw_far_above_the_expected_size_stops_generation():
    # 20 sessions are expected to hold ~200 M tokens, under the cap; a seed that draws a
    # 1,000-turn session (~275 M: it ends near 523 turns, at MAX_LEN) is stopped
    for seed in range(200):
        w = workload_from_dict(body(HEAVY_TURNS, num=20, seed=seed))
        try:
            specs = w.generate()
        except WorkloadError as e:
            assert f"more than {MAX_WORKLOAD_TOKENS:,}" in str(e)
            return
        assert sum(s.prompt_len + s.output_len for s in specs) <= MAX_WORKLOAD_TOKENS
    pytest.fail("no seed in 200 drew a 1,000-turn session")


def _turns():
    small = st.integers(1, 40)
    return st.one_of(
        small.map(lambda n: {"fixed": n}),
        st.tuples(small, small).map(lambda t: {"uniform": sorted(t)}),
        st.lists(small, min_size=1, max_size=12).map(lambda v: {"empirical": v}),
        st.tuples(st.integers(1, 8), st.integers(8, 60)).map(
            lambda t: {"lognormal": {"p50": t[0], "p99": t[1], "max": 60}}))


@settings(max_examples=40, deadline=None)
@given(turns=_turns(), prompt=st.integers(1, 50), output=st.integers(1, 50),
       user=st.integers(1, 50), seed=st.integers(0, 1000))
def test_the_estimate_bounds_what_is_generated(turns, prompt, output, user, seed):
    """Over 400 sessions, the tokens per session generated stay within four standard
    errors of the expected size the guard checks (the mean of independent sessions)."""
    w = workload_from_dict(body(turns, num=400, prompt=prompt, output=output, user=user,
                                seed=seed))
    sizes: dict[int, int] = {}
    for s in w.generate():
        session = s.index if s.session is None else s.session
        sizes[session] = sizes.get(session, 0) + s.prompt_len + s.output_len
    per = list(sizes.values())
    mean = sum(per) / len(per)
    sd = math.sqrt(sum((x - mean) ** 2 for x in per) / (len(per) - 1)) if len(per) > 1 else 0
    estimate = w.classes[0].mean_tokens()
    assert mean <= estimate + 4 * sd / math.sqrt(len(per)) + 1e-9, (mean, estimate)
