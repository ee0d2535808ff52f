"""Engine kinds: each preset is the engine's own defaults (read from its source, cited
line by line), expressed as our scheduler's settings, and a run under a kind behaves as
its preset says."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import yaml

from stepserve.cli import main
from stepserve.config.limits import MAX_NUM_SEQS
from stepserve.sim.cost import ConstantCost
from stepserve.sim.engine_kinds import KINDS, LLAMACPP, STEPSERVE, VLLM, get_engine_kind
from stepserve.sim.loop import simulate
from stepserve.workload.spec import RequestSpec

# vLLM 0.32.0 (the CPU build beside ours), as read at these lines:
VLLM_0_32_CPU = {
    # engine/arg_utils.py:2975-2983: on a CPU platform, OPENAI_API_SERVER gets
    # max_num_batched_tokens 2048 x world_size and max_num_seqs 128 x world_size
    "max_num_batched_tokens": 2048, "max_num_seqs": 128,
    # config/scheduler.py:134 enable_chunked_prefill: bool = True
    "enable_chunked_prefill": True,
    # config/scheduler.py:79 long_prefill_token_threshold: int = Field(default=0, ge=0)
    "long_prefill_token_threshold": 0,
    # config/scheduler.py:159 policy: SchedulerPolicy = "fcfs"
    "policy": "fcfs",
    # v1/core/sched/scheduler.py:1589-1593: a preempted request's blocks are freed and
    # num_computed_tokens = 0 (recompute; v1 has no swap)
    "preemption_mode": "recompute",
    # v1/core/sched/scheduler.py:657 "First, schedule the RUNNING requests", :899-900
    # "Next, schedule the WAITING requests" only `if not preempted_reqs`
    "budget_order": "decode_first",
    # platforms/cpu.py:292-293: block_size = 128 unless the user gave one
    "block_size": 128,
    # config/cache.py:141 enable_prefix_caching: bool = True
    "enable_prefix_caching": True,
    # config/scheduler.py:196 watermark: float = Field(default=0.0, ...)
    "watermark": 0.0,
    # config/scheduler.py:92 max_num_queued_reqs: int | None = None (no queue cap)
    "max_waiting": 0,
    # v1/core/sched/scheduler.py:797-802: the victim is running[-1] (or the worst
    # priority); no aging anywhere in schedule()
    "aging_after_s": 0.0,
    # v1 has no max_num_partial_prefills: every running request's chunk is scheduled
    # while the budget lasts (scheduler.py:657 on), so no cap of ours may bind
    "max_num_partial_prefills": MAX_NUM_SEQS, "max_long_partial_prefills": MAX_NUM_SEQS,
}


def test_the_vllm_preset_is_vllms_cpu_defaults():
    assert VLLM.settings == VLLM_0_32_CPU
    assert set(VLLM.sources) == set(VLLM.settings)  # each value says where it was read


VLLM_SITE = sorted(glob.glob("/work/vllm-venv/lib/python3*/site-packages/vllm"))


@pytest.mark.skipif(not VLLM_SITE, reason="vLLM's source is not installed here")
def test_the_cited_lines_say_what_the_preset_took():
    root = Path(VLLM_SITE[0])

    def line(path: str, n: int) -> str:
        return (root / path).read_text().splitlines()[n - 1]

    assert "OPENAI_API_SERVER: 2048" in line("engine/arg_utils.py", 2978)
    assert "OPENAI_API_SERVER: 128" in line("engine/arg_utils.py", 2982)
    assert "enable_chunked_prefill: bool = True" in line("config/scheduler.py", 134)
    assert "long_prefill_token_threshold: int = Field(default=0" in line(
        "config/scheduler.py", 79)
    assert 'policy: SchedulerPolicy = "fcfs"' in line("config/scheduler.py", 159)
    assert "num_computed_tokens = 0" in line("v1/core/sched/scheduler.py", 1593)
    assert "block_size = 128" in line("platforms/cpu.py", 293)
    assert "enable_prefix_caching: bool = True" in line("config/cache.py", 141)
    assert "watermark: float = Field(default=0.0" in line("config/scheduler.py", 196)


def test_llamacpp_maps_what_it_can_and_names_the_rest():
    s = LLAMACPP.settings
    assert s["max_num_batched_tokens"] == 2048  # n_batch
    assert s["preemption_mode"] == "none"  # a slot owns its context
    assert len(LLAMACPP.approximations) >= 3
    assert any("n_ubatch" in a for a in LLAMACPP.approximations)
    assert STEPSERVE.settings == {}  # our defaults
    LLAMACPP.base_config()  # our settings accept every preset
    VLLM.base_config()


def test_an_unknown_kind_is_refused():
    with pytest.raises(Exception, match="allowed: stepserve, vllm, llamacpp"):
        get_engine_kind("sglang")
    assert set(KINDS) == {"stepserve", "vllm", "llamacpp"}


def test_a_run_under_the_vllm_kind_behaves_as_its_preset(tmp_path, capsys):
    """Prompts of 3,000 tokens under vLLM's CPU budget of 2048: every step holds at
    most 2048 tokens, and a KV pool too small for all of them preempts by recompute."""
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "long", "seed": 2, "num_requests": 12, "arrival": {"poisson": {"rate": 100.0}},
        "classes": [{"name": "a", "share": 1, "prompt": {"fixed": 3000},
                     "output": {"fixed": 200}}]}))
    out = tmp_path / "r.json"
    rc = main(["simulate", "--workload", str(wl), "--cost", "constant", "--engine-kind",
               "vllm", "--num-gpu-blocks", "60", "--no-progress", "--json", str(out)])
    assert rc == 0
    assert "engine kind: vllm" in capsys.readouterr().out
    run = json.loads(out.read_text())["runs"][0]
    sc, cache = run["config"]["scheduler"], run["config"]["cache"]
    assert (sc["max_num_batched_tokens"], sc["preemption_mode"]) == (2048, "recompute")
    assert cache["block_size"] == 128 and run["config"]["queue"]["aging_after_s"] == 0.0
    summary = run["summary"]
    assert summary["preemptions"] > 0  # 60 blocks of 128: room for two at once
    assert summary["recomputed_tokens"] > 0  # recompute: the victims' prompts again
    assert summary["requests_finished"] == 12


def test_the_vllm_kinds_steps_keep_its_budget():
    specs = [RequestSpec(index=i, arrival_s=0.0, prompt_len=3000, output_len=50,
                         max_tokens=50) for i in range(6)]
    sim = simulate(VLLM.base_config(), specs, ConstantCost(0.01), 200)
    tokens = [s.num_prefill_tokens + s.num_decode_tokens for s in sim.all_steps]
    assert max(tokens) == 2048  # the budget is met and never passed
