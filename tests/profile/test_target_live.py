"""`profile --target` against our own server over the tiny model: the settings inferred
from HTTP and /metrics equal the ones it was started with (two of each), and prefix
caching is told on from off; against a server without /metrics, the slot count comes
from the client's timings alone."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_harness import make_engine, serve  # noqa: E402
from stub_server import stub_server  # noqa: E402

from stepserve.profile.infer import infer_settings  # noqa: E402
from stepserve.profile.target import TargetOptions, run_probes  # noqa: E402
from stepserve.profile.target_profile import build_profile  # noqa: E402


def probe(url: str):
    return asyncio.run(run_probes(TargetOptions(url, budget_s=60)))


@pytest.mark.parametrize("seqs, budget, caching", [(3, 32, True), (6, 64, False)])
def test_inferred_settings_equal_the_servers(seqs, budget, caching):
    with serve(make_engine(max_num_seqs=seqs, max_num_batched_tokens=budget,
                           enable_prefix_caching=caching)) as served:
        figs = probe(served.url)
    s = infer_settings(figs)
    assert figs.target.engine == "stepserve" and figs.target.max_model_len == 256
    assert (s.max_num_seqs.value, s.max_num_seqs.at_least) == (seqs, False)
    assert s.max_num_seqs.confidence == "high"
    assert (s.token_budget.value, s.token_budget.at_least) == (budget, False)
    assert s.chunked_prefill.value is True
    assert s.prefix_caching.value is caching and s.prefix_caching.confidence == "high"
    assert s.kv_capacity_tokens.value == 512 * 16
    profile = build_profile(figs)  # and it fits
    assert profile.fit.cost.coefficients and profile.fit.spread.step_gap.count > 0


def test_without_metrics_the_slots_come_from_timings():
    with stub_server(slots=2) as url:
        figs = probe(url)
    s = infer_settings(figs)
    assert figs.target.engine is None
    assert any("/metrics" in note for note in figs.notes)
    assert s.max_num_seqs.value == 2 and not s.max_num_seqs.at_least
    assert "client timings" in s.max_num_seqs.evidence[0]
    assert s.kv_capacity_tokens.value is None
