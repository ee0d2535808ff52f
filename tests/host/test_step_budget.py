"""Scheduling defaults from the hardware (host/step_budget.py): a CPU gets a step
budget of a few hundred tokens that grows with its cores, a GPU keeps the config's
defaults, and whatever the user sets wins without making the config invalid."""

from __future__ import annotations

import pytest

from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import EngineConfig
from stepserve.engine import llm_engine
from stepserve.host.step_budget import Hardware, cpu_step_budget, hardware_base

SMOLLM2_PREFILL_PARAMS = 106_203_456  # SmolLM2-135M without its (tied) embedding table


def scheduler_of(settings: dict, budget) -> tuple[int, int]:
    overrides = ConfigOverrides(settings=settings)
    sc = overrides.apply(hardware_base(budget, overrides.apply())).scheduler
    return sc.max_num_batched_tokens, sc.long_prefill_token_threshold


def test_the_default_changes_with_the_device():
    two = cpu_step_budget(Hardware("cpu", 2, "AVX2"), SMOLLM2_PREFILL_PARAMS)
    sixteen = cpu_step_budget(Hardware("cpu", 16, "AVX2"), SMOLLM2_PREFILL_PARAMS)
    wide = cpu_step_budget(Hardware("cpu", 16, "AVX512"), SMOLLM2_PREFILL_PARAMS)
    gpu = cpu_step_budget(Hardware("cuda"), SMOLLM2_PREFILL_PARAMS)
    assert (two.max_num_batched_tokens, two.long_prefill_token_threshold) == (256, 128)
    assert (sixteen.max_num_batched_tokens, sixteen.long_prefill_token_threshold) == (1280, 1152)
    assert wide.long_prefill_token_threshold == 2048  # the cap
    assert gpu is None  # the config's 8,192 stands
    assert scheduler_of({}, gpu) == (8192, 0)
    # a prompt chunk adds at most ~PREFILL_STEP_S at the estimated rate
    assert two.long_prefill_token_threshold / two.prefill_tokens_per_s <= 0.5


def test_a_bigger_model_gets_smaller_chunks():
    small = cpu_step_budget(Hardware("cpu", 8, "AVX2"), 100_000_000)
    big = cpu_step_budget(Hardware("cpu", 8, "AVX2"), 1_000_000_000)
    assert big.long_prefill_token_threshold < small.long_prefill_token_threshold
    assert cpu_step_budget(Hardware("cpu", 1, "DEFAULT"), 7_000_000_000) \
        .long_prefill_token_threshold == 64  # the floor


@pytest.mark.parametrize("settings,want", [
    ({}, (256, 128)),
    ({"max_num_batched_tokens": 100}, (100, 100)),  # the user's budget caps our chunk
    ({"max_num_batched_tokens": 8192}, (8192, 128)),  # even when it equals the default
    ({"long_prefill_token_threshold": 1000}, (1000, 1000)),  # the user's chunk fits
    ({"long_prefill_token_threshold": 0}, (256, 0)),
    ({"enable_chunked_prefill": False, "max_model_len": 2048}, (2048, 128)),
])
def test_user_settings_win_and_stay_valid(settings, want):
    budget = cpu_step_budget(Hardware("cpu", 2, "AVX2"), SMOLLM2_PREFILL_PARAMS)
    assert scheduler_of(settings, budget) == want


def test_engine_takes_the_hardware_defaults_only_without_a_full_config(monkeypatch):
    monkeypatch.setattr(llm_engine, "runner_hardware",
                        lambda runner: Hardware("cpu", 2, "AVX2"))
    monkeypatch.setattr(llm_engine, "prefill_params", lambda args: SMOLLM2_PREFILL_PARAMS)
    engine = llm_engine.LLMEngine("tiny")
    assert engine.config.scheduler.max_num_batched_tokens == 256
    flags = llm_engine.LLMEngine("tiny", ConfigOverrides(settings={"max_num_seqs": 4}),
                                 runner=engine.runner)
    assert flags.config.scheduler.max_num_batched_tokens == 256
    assert flags.config.scheduler.max_num_seqs == 4
    explicit = llm_engine.LLMEngine("tiny", EngineConfig(), runner=engine.runner)
    assert explicit.config.scheduler.max_num_batched_tokens == 8192
    monkeypatch.setattr(llm_engine, "runner_hardware", lambda runner: Hardware("cuda"))
    assert llm_engine.LLMEngine("tiny", runner=engine.runner).config.scheduler \
        .max_num_batched_tokens == 8192


def test_a_prompt_wave_never_takes_more_than_one_budget_per_step(monkeypatch):
    """32 prompts of 128 tokens arrive while 4 sequences decode: no step carries more
    than the CPU budget, and the decodes run in every step."""
    from stepserve.core.request import SamplingParams

    monkeypatch.setattr(llm_engine, "runner_hardware",
                        lambda runner: Hardware("cpu", 2, "AVX2"))
    monkeypatch.setattr(llm_engine, "prefill_params", lambda args: SMOLLM2_PREFILL_PARAMS)
    engine = llm_engine.LLMEngine("tiny", ConfigOverrides(settings={"num_gpu_blocks": 1024}))
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    decoding = [engine.add_request([5] * 8, long) for _ in range(4)]
    engine.step()
    # distinct prompts: a shared one would come from the prefix cache, not the budget
    wave = [engine.add_request([10 + i] + [7] * 127,
                               SamplingParams(max_tokens=2, ignore_eos=True))
            for i in range(32)]
    steps = 0
    while not all(r.is_finished for r in wave):
        result = engine.step()
        rec = result.record
        assert rec.num_prefill_tokens + rec.num_decode_tokens <= 256
        emitted = {r.request_id for r in result.emitted}
        assert all(r.is_finished or r.request_id in emitted for r in decoding)
        steps += 1
    assert steps >= 32 * 128 // 256  # the wave was spread over many steps
    assert not all(r.is_finished for r in decoding)  # and decodes kept going through it
