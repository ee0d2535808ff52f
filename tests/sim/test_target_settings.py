"""A target profile's inferred settings in `simulate`/`bench --sim`/`sweep`: used unless
a flag or the run's own settings say otherwise, each said with its confidence, and a
clash between layers resolved or refused by name. The profile is built from the recorded
probe figures of tests/fixtures/target-profile (max_num_seqs 3, budget 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stepserve.cli import main
from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.profile.probe_figures import ProbeFigures
from stepserve.profile.target_profile import build_profile
from stepserve.sim.target_settings import ProfileSettings, target_layers

FIXTURE = (Path(__file__).parents[1] / "fixtures" / "target-profile"
           / "tiny-seqs3-budget32.json")


@pytest.fixture(scope="module")
def profile_json() -> dict:
    figs = ProbeFigures.from_json(json.loads(FIXTURE.read_text()))
    return build_profile(figs).to_json()


def write(tmp_path, data: dict, name: str = "profile.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def workload(tmp_path, prompt: int = 40, n: int = 30) -> str:
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "small", "seed": 1, "num_requests": n, "arrival": {"poisson": {"rate": 50.0}},
        "classes": [{"name": "a", "share": 1, "prompt": {"fixed": prompt},
                     "output": {"fixed": 20}}]}))
    return str(wl)


def simulate(tmp_path, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "r.json"
    rc = main(["simulate", "--no-progress", "--json", str(out), *flags])
    assert rc == 0
    return json.loads(out.read_text())["runs"][0], ""


def test_the_profiles_settings_apply_and_are_said(tmp_path, profile_json, capsys):
    run, _ = simulate(tmp_path, "--workload", workload(tmp_path), "--cost",
                      write(tmp_path, profile_json))
    sc, cache = run["config"]["scheduler"], run["config"]["cache"]
    assert (sc["max_num_seqs"], sc["max_num_batched_tokens"]) == (3, 32)
    assert sc["max_model_len"] == 256 and cache["enable_prefix_caching"] is True
    assert cache["num_gpu_blocks"] == 8192 // cache["block_size"]
    out = capsys.readouterr().out
    assert "engine kind: stepserve (from profile" in out  # the profile's engine
    assert "max_num_seqs 3 (high)" in out and "max_num_batched_tokens 32 (high)" in out


def test_a_flag_wins_over_the_profile_and_says_so(tmp_path, profile_json, capsys):
    run, _ = simulate(tmp_path, "--workload", workload(tmp_path), "--cost",
                      write(tmp_path, profile_json), "--max-num-seqs", "8")
    assert run["config"]["scheduler"]["max_num_seqs"] == 8
    assert run["config"]["scheduler"]["max_num_batched_tokens"] == 32
    assert "max_num_seqs 3 not used: the command line's wins" in capsys.readouterr().out


def test_a_bound_or_a_low_confidence_setting_is_used_and_said(tmp_path, profile_json, capsys):
    data = json.loads(json.dumps(profile_json))
    data["settings"]["max_num_seqs"].update(value=8, at_least=True, confidence="low")
    run, _ = simulate(tmp_path, "--workload", workload(tmp_path), "--cost", write(tmp_path, data))
    assert run["config"]["scheduler"]["max_num_seqs"] == 8
    out = capsys.readouterr().out
    assert "max_num_seqs 8 (low); inferred only as a lower bound (>= 8): used as is" in out
    assert "low confidence" in out


def test_a_runs_threshold_above_the_inferred_budget_is_clamped_with_a_note(profile_json):
    """A scenario's run with long_prefill_token_threshold 1024 (quickstart's C) and no
    budget of its own over a profile's budget of 32: a chunk never exceeds the budget, so
    the threshold becomes 32 and the note says what to pass to keep it."""
    layers = target_layers(None, ProfileSettings.from_json("profile p", profile_json))
    own = EngineConfig().replace(long_prefill_token_threshold=1024)
    config, notes = layers.config_for(own, ConfigOverrides(), "C")
    assert config.scheduler.max_num_batched_tokens == 32
    assert config.scheduler.long_prefill_token_threshold == 32
    (said,) = [text for run, text in notes if "clamped" in text]
    assert "1024" in said and "--max-num-batched-tokens 1024" in said


def test_a_flag_that_clashes_with_the_profile_is_refused_by_name(tmp_path, profile_json, capsys):
    rc = main(["simulate", "--no-progress", "--workload", workload(tmp_path), "--cost",
               write(tmp_path, profile_json), "--long-prefill-token-threshold", "1024"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "long_prefill_token_threshold = 1024" in err
    assert "max_num_batched_tokens = 32 came from profile" in err
    assert "pass --max-num-batched-tokens" in err
    layers = target_layers(None, ProfileSettings.from_json("profile p", profile_json))
    with pytest.raises(ConfigError, match="came from profile p"):
        layers.config_for(EngineConfig(), ConfigOverrides(settings={
            "long_prefill_token_threshold": 1024}))


def test_without_a_profile_or_kind_the_runs_are_as_before():
    layers = target_layers(None, None)
    assert not layers.active
    own = EngineConfig().replace(max_num_seqs=5)
    assert layers.config_for(own, ConfigOverrides())[0] == own


def test_bench_sim_takes_the_profiles_settings(tmp_path, profile_json, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "--sim", "--cost", write(tmp_path, profile_json), "--dataset-name",
               "random", "--random-input-len", "40", "--random-output-len", "10",
               "--num-prompts", "20", "--request-rate", "inf", "--json", str(out),
               "--no-progress"])
    assert rc == 0
    assert "max_num_seqs 3 (high)" in capsys.readouterr().err
    assert '"max_num_seqs": 3' in out.read_text()


def test_sweep_takes_the_profiles_settings_under_its_axis(tmp_path, profile_json, capsys):
    out = tmp_path / "s.json"
    rc = main(["sweep", "--workload", workload(tmp_path), "--cost",
               write(tmp_path, profile_json), "--vary", "max_num_seqs=2,4", "--requests",
               "20", "--quiet", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "max_num_batched_tokens 32 (high)" in capsys.readouterr().err
    configs = [r["config"]["scheduler"] for r in json.loads(out.read_text())["runs"]]
    assert [(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in configs] == [
        (2, 32), (4, 32)]  # the axis over the profile's budget


def test_the_kv_capacity_is_counted_in_the_runs_block_size(profile_json):
    """8192 tokens of KV: 64 blocks under vLLM's 128-token blocks, 512 under a flag's 16."""
    layers = target_layers("vllm", ProfileSettings.from_json("profile p", profile_json))
    assert layers.config_for(EngineConfig(), ConfigOverrides())[0].cache.num_gpu_blocks == 64
    config = layers.config_for(EngineConfig(), ConfigOverrides(settings={"block_size": 16}))[0]
    assert (config.cache.block_size, config.cache.num_gpu_blocks) == (16, 512)
