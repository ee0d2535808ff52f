"""Inference and fitting on recorded probe figures (no server): the fixture is one real
`profile --target` run against our server over the tiny model with max_num_seqs 3,
max_num_batched_tokens 32 and prefix caching on (tests/profile/make_fixture.py made
it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepserve.cli import main
from stepserve.profile.infer import Inferred, infer_settings, overlap_peak
from stepserve.profile.probe_figures import ProbeFigures, ProbeRun, Timing
from stepserve.profile.target_fit import Distribution, prefill_steps
from stepserve.profile.target_profile import build_profile
from stepserve.sim.calibrated import TARGET_PROFILE_SCHEMA
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for

FIXTURE = (Path(__file__).parents[1] / "fixtures" / "target-profile"
           / "tiny-seqs3-budget32.json")


@pytest.fixture(scope="module")
def figs() -> ProbeFigures:
    return ProbeFigures.from_json(json.loads(FIXTURE.read_text()))


def test_the_recording_reads_back_as_it_was_written(figs):
    assert ProbeFigures.from_json(json.loads(json.dumps(figs.to_json()))) == figs
    assert {r.kind for r in figs.runs} == {"floor", "prompt", "burst", "decode", "mixed",
                                           "repeat"}


def test_inferred_settings_are_the_servers(figs):
    s = infer_settings(figs)
    assert (s.max_num_seqs.value, s.max_num_seqs.confidence) == (3, "high")
    assert (s.token_budget.value, s.token_budget.at_least) == (32, False)
    assert s.chunked_prefill.value is True
    assert s.prefix_caching.value is True
    assert s.kv_capacity_tokens.value == 8192
    for _, inferred in s.items():
        assert inferred.evidence  # each says why


def test_without_the_step_counter_the_budget_is_only_a_bound(figs):
    """The same run as a server without a step counter would have given it: the budget is
    at best a low-confidence guess, never a confident wrong one."""
    stripped = ProbeFigures(figs.target, tuple(
        ProbeRun(r.kind, r.prompt_len, r.batch, r.output_len, r.long_len, r.requests)
        for r in figs.runs), figs.budget_s)
    s = infer_settings(stripped)
    assert s.token_budget.confidence == "low"
    assert s.max_num_seqs.value == 3 and s.max_num_seqs.confidence == "medium"


def test_the_fit_and_its_spread(figs):
    profile = build_profile(figs)
    cost, spread = profile.fit.cost, profile.fit.spread
    assert cost.coefficients.get("step", 0.0) > 0.0
    assert profile.fit.rows >= 10 and "median" in profile.fit.held_out_error
    for dist in (spread.step_gap, spread.http_floor):
        qs = [dist.quantiles[k] for k in ("p50", "p90", "p99", "p99.9", "max")]
        assert qs == sorted(qs) and dist.samples == tuple(sorted(dist.samples))
        assert 0 < len(dist.samples) <= dist.count
    assert spread.mixed_growth is not None and spread.mixed_growth > 0


def test_refit_writes_a_profile_every_cost_flag_loads(figs, tmp_path, capsys):
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    first.write_text(json.dumps(build_profile(figs).to_json()))
    assert main(["profile", "--refit", str(first), "--out", str(again)]) == 0
    assert "max_num_seqs        3 (high)" in capsys.readouterr().out
    data = json.loads(again.read_text())
    assert data["schema"] == TARGET_PROFILE_SCHEMA
    assert data["settings"]["token_budget"]["value"] == 32
    setup = cost_setup_for(CostModelOptions(cost=str(again)))
    assert setup.cost_model.inner.coefficients == data["cost"]["coefficients"]  # spread on top
    plain = cost_setup_for(CostModelOptions(cost=str(again), no_spread=True))
    assert plain.cost_model.coefficients == data["cost"]["coefficients"]


@pytest.mark.parametrize("tamper, said", [
    (lambda d: d["probes"]["runs"][0]["requests"][0].update(send_s="soon"), "send_s"),
    (lambda d: d["probes"]["runs"][0].update(kind="guess"), "kind"),
    (lambda d: d["probes"].update(runs={}), "probes.runs"),
    (lambda d: d.update(probes=None), "probes"),
])
def test_a_broken_profile_is_one_line(figs, tmp_path, capsys, tamper, said):
    data = build_profile(figs).to_json()
    tamper(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["profile", "--refit", str(path), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and said in err and "\n" not in err


def test_a_broken_cost_part_is_refused_by_cost_loaders(figs, tmp_path):
    data = build_profile(figs).to_json()
    data["cost"]["coefficients"]["step"] = -1.0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="coefficients.step"):
        cost_setup_for(CostModelOptions(cost=str(path)))
    data["cost"] = {"schema": "other"}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="target profile: `cost`"):
        cost_setup_for(CostModelOptions(cost=str(path)))


def test_prefill_packing():
    """Whole prompts first, the last one chunked; a step never passes the budget."""
    steps = prefill_steps([20, 20, 20], 32)
    assert [s.num_scheduled_tokens for s in steps] == [[20, 12], [8, 20]]
    assert [s.num_scheduled_tokens for s in prefill_steps([40], None)] == [[40]]
    mixed = prefill_steps([40], 32, decodes=4, context=16)
    assert [sum(s.num_scheduled_tokens) for s in mixed] == [32, 4 + 12]


def test_overlap_peak_counts_a_queued_request_once_its_first_token_comes():
    run = ProbeRun("decode", 4, 3, 3, requests=(
        Timing(4, 3, 0.0, (1.0, 2.0, 3.0), 3.0), Timing(4, 3, 0.0, (1.0, 2.0, 3.0), 3.0),
        Timing(4, 3, 0.0, (4.0, 5.0, 6.0), 6.0)))
    assert overlap_peak(run) == 2


def test_inferred_checks_its_confidence():
    with pytest.raises(ValueError, match="confidence"):
        Inferred(1, ("x",), "sure")
    assert Distribution.of([], 0.0).count == 0
