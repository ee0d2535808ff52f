"""The calibrated cost model: its terms, its fit (known coefficients come back within 2%
from synthetic step times), and its JSON."""

from __future__ import annotations

import random
import re

import pytest

from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.sim.calibrated import TERMS, CalibratedCost, fit, relative_errors, step_terms

TRUE = {"step": 0.020, "seq": 150e-6, "token": 900e-6, "token_hi": 300e-6,
        "kv_read": 40e-9, "attn": 3e-9, "swap": 80e-6, "join": 500e-6}


def _request(i: int, prompt: int, computed: int, outputs: int) -> Request:
    req = Request(f"r{i}", [1] * prompt, SamplingParams(max_tokens=4096), 0.0)
    req.output_token_ids.extend([2] * outputs)
    req.num_computed_tokens = computed
    return req


def random_step(rng: random.Random) -> SchedulerOutput:
    """A batch of decodes (some long contexts), maybe a prefill chunk, maybe swaps."""
    reqs, counts = [], []
    for i in range(rng.choice([0, 1, 2, 4, 8, 16, 32, 64])):
        ctx = rng.choice([16, 64, 256, 1024])
        reqs.append(_request(i, ctx, ctx, 1))  # one token to compute: decoding
        counts.append(1)
    if rng.random() < 0.6 or not reqs:
        start, n = rng.choice([0, 0, 128, 512]), rng.choice([8, 32, 128, 256, 512])
        reqs.append(_request(999, start + n + 5, start, 0))
        counts.append(n)
    out = SchedulerOutput(0, reqs, counts)
    if rng.random() < 0.2:
        out.swap_out = [(b, b) for b in range(rng.randrange(1, 40))]
    return out


def test_terms_count_the_work_of_a_step():
    decode = _request(1, 100, 100, 1)  # context 101 after this token
    chunk = _request(2, 300, 100, 0)  # 50 more prompt tokens after 100
    out = SchedulerOutput(0, [decode, chunk], [1, 50])
    out.swap_in = [(1, 2), (3, 4)]
    terms = dict(zip(TERMS, step_terms(out, knee_tokens=32)))
    assert terms == {"step": 1, "seq": 2, "token": 51, "token_hi": 19, "kv_read": 101,
                     "attn": 50 * (100 + 51 / 2), "swap": 2, "join": 0, "chunk": 1}
    # a chunk from token 0 is a request joining the batch (new, or recomputed)
    fresh = SchedulerOutput(0, [decode, _request(3, 40, 0, 0)], [1, 40])
    assert dict(zip(TERMS, step_terms(fresh, knee_tokens=32)))["join"] == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_recovers_known_coefficients_within_two_percent(seed):
    rng = random.Random(seed)
    truth = CalibratedCost(TRUE, knee_tokens=64)
    outs = [random_step(rng) for _ in range(300)]
    rows = [step_terms(o, 64) for o in outs]
    got = fit(rows, [truth.step_time(o) for o in outs])
    for term, value in TRUE.items():
        assert got[term] == pytest.approx(value, rel=0.02), term


@pytest.mark.parametrize("seed", [0, 1])
def test_with_noisy_times_predictions_stay_within_the_noise(seed):
    # +-1% noise: a term that contributes little (KV reads here) may come back less
    # exact, but what matters, the predicted step times of unseen steps, stays close
    rng = random.Random(seed)
    truth = CalibratedCost(TRUE, knee_tokens=64)
    train, test = [random_step(rng) for _ in range(300)], [random_step(rng) for _ in range(100)]
    got = CalibratedCost(fit([step_terms(o, 64) for o in train],
                             [truth.step_time(o) * rng.uniform(0.99, 1.01) for o in train]), 64)
    errors = relative_errors(got, [step_terms(o, 64) for o in test],
                             [truth.step_time(o) for o in test])
    assert max(errors) < 0.02
    for term in ("step", "token", "token_hi"):  # the big terms are still found closely
        assert got.coefficients[term] == pytest.approx(TRUE[term], rel=0.05), term


def test_coefficients_stay_non_negative():
    # times that fall with tokens would need a negative per-token cost: it is zero instead
    rows = [(1.0, 1.0, float(n), 0.0, 0.0, 0.0, 0.0) for n in (1, 10, 100)]
    got = fit(rows, [0.03, 0.02, 0.01])
    assert all(v >= 0 for v in got.values())


def test_json_round_trip_and_refusals():
    model = CalibratedCost(TRUE, 64, {"model": "tiny", "hardware": "2-core CPU"})
    again = CalibratedCost.from_json(model.to_json())
    assert again == model
    out = random_step(random.Random(5))
    assert again.step_time(out) == model.step_time(out)
    with pytest.raises(ValueError, match="schema"):
        CalibratedCost.from_json({"coefficients": TRUE})
    with pytest.raises(ValueError, match=r"coefficients.step = -1: must be a finite number "
                                         r"in \[0, 60\]"):
        CalibratedCost.from_json({**model.to_json(), "coefficients": {"step": -1.0}})
    with pytest.raises(ValueError, match="unknown cost terms"):
        CalibratedCost({"warp": 1.0})


@pytest.mark.parametrize("change, refusal", [
    # a coefficient so large that a step's time, and then the virtual clock, overflows
    ({"coefficients": {"step": 1e300}}, r"coefficients.step = 1e\+300: must be a finite "
                                        r"number in \[0, 60\]"),
    ({"coefficients": {"token": float("inf")}}, r"coefficients.token = inf"),
    ({"coefficients": {"step": "0.01"}}, r"coefficients.step = '0.01'"),
    ({"coefficients": [0.01]}, r"`coefficients` must map terms to seconds per unit"),
    ({"knee_tokens": float("inf")}, r"knee_tokens = inf: must be an integer in \[0, 16777216\]"),
    ({"knee_tokens": 64.5}, r"knee_tokens = 64.5: must be an integer"),
    ({"knee_tokens": -1}, r"knee_tokens = -1"),
])
def test_cost_files_are_bounded_so_the_clock_stays_finite(change, refusal):
    data = {**CalibratedCost(TRUE, 64).to_json(), **change}
    with pytest.raises(ValueError, match=refusal):
        CalibratedCost.from_json(data)


def test_the_largest_allowed_cost_file_still_runs_to_a_finite_clock():
    cost = CalibratedCost.from_json({"schema": "stepserve.cost/1", "knee_tokens": 0,
                                     "coefficients": dict.fromkeys(TERMS, 60)})
    t = cost.step_time(random_step(random.Random(7)))
    assert 0 < t < float("inf")


@pytest.mark.parametrize("key, value, words", [
    ("kv_cache_bytes", "lots", "kv_cache_bytes = 'lots': must be an integer in [1, "),
    ("kv_cache_bytes", 1.5, "kv_cache_bytes = 1.5: must be an integer"),
    ("kv_cache_bytes", True, "kv_cache_bytes = True: must be an integer"),
    ("kv_bytes_per_token", 0, "kv_bytes_per_token = 0: must be an integer in [1, "),
    ("host", ["a"], "host = ['a']: must be a string (or null)"),
])
def test_what_a_run_reads_of_where_a_cost_was_measured_is_checked(key, value, words):
    # a KV size of "lots" reached the pool's arithmetic: TypeError; True read as 1 byte
    with pytest.raises(ValueError, match=re.escape(words)):
        CalibratedCost.from_json({"schema": "stepserve.cost/1",
                                  "coefficients": {"step": 0.01}, key: value})
