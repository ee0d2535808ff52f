"""vLLM's sampling features in the real engine on the tiny model: logprobs (output and
prompt) equal a transformers forward pass of the same tokens, through chunked prefill and
recompute after preemption; n > 1 as child requests (their KV, their seeds, their abort);
min_tokens; max_tokens=None; LLM.chat; the simulator's runner takes the same params."""

from __future__ import annotations

import pytest
import torch

from stepserve import LLM, SamplingParams
from stepserve.config.settings import EngineConfig
from stepserve.core.clock import VirtualClock
from stepserve.core.engine_core import EngineCore
from stepserve.core.request import Request, child_params
from stepserve.engine.llm_engine import LLMEngine
from stepserve.engine.outputs import decode_output
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import SimRunner

TOL = 1e-4


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from stepserve.model.presets import resolve_model

    hf_logging.set_verbosity_error()
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"),
                                                dtype=torch.float32).eval()


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log P(next token | ids[:p + 1])."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def check_position(found, ref_row: torch.Tensor, token: int, k: int) -> None:
    """One position's vLLM-shaped dict against the reference distribution."""
    assert found[token].logprob == pytest.approx(ref_row[token].item(), abs=TOL)
    assert found[token].rank == int((ref_row >= ref_row[token] - 1e-6).sum()) or \
        found[token].rank == int((ref_row > ref_row[token]).sum()) + 1
    top = ref_row.topk(k)
    for tid, value in zip(top.indices.tolist(), top.values.tolist(), strict=True):
        assert found[tid].logprob == pytest.approx(value, abs=TOL)


@pytest.fixture(scope="module")
def llm():
    # a small step budget: long prompts are prefilled in chunks of 16 tokens
    return LLM("tiny", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=16,
               long_prefill_token_threshold=16)


def test_output_and_prompt_logprobs_match_transformers(llm, hf_model):
    prompts = [list(range(5, 45)), [3, 9, 27, 81, 243], list(range(100, 160, 2))]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3,
                            prompt_logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        done = out.outputs[0]
        ref = hf_logprobs(hf_model, prompt + done.token_ids)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for p in range(1, len(prompt)):
            check_position(out.prompt_logprobs[p], ref[p - 1], prompt[p], 2)
        assert len(done.logprobs) == 6
        for k, tok in enumerate(done.token_ids):
            check_position(done.logprobs[k], ref[len(prompt) - 1 + k], tok, 3)
        assert done.cumulative_logprob == pytest.approx(
            sum(done.logprobs[k][t].logprob for k, t in enumerate(done.token_ids)))
    assert llm.scheduler.kv.all_free


def test_prompt_logprobs_survive_recompute(hf_model):
    """Few KV blocks: requests are preempted and recomputed mid-way; each prompt is still
    scored exactly once per position, with the right values."""
    llm = LLM("tiny", max_model_len=80, max_num_seqs=8, num_gpu_blocks=12, block_size=8,
              max_num_batched_tokens=24, long_prefill_token_threshold=24,
              preemption_mode="recompute")
    prompts = [list(range(10 + i, 50 + i)) for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1,
                            prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.scheduler.num_preemptions_total > 0, "the test must preempt"
    for prompt, out in zip(prompts, outs, strict=True):
        ref = hf_logprobs(hf_model, prompt + out.outputs[0].token_ids)
        assert len(out.prompt_logprobs) == len(prompt)
        assert len(out.outputs[0].logprobs) == 30
        for p in range(1, len(prompt)):
            check_position(out.prompt_logprobs[p], ref[p - 1], prompt[p], 1)
        for k, tok in enumerate(out.outputs[0].token_ids):
            check_position(out.outputs[0].logprobs[k], ref[len(prompt) - 1 + k], tok, 1)
    assert llm.scheduler.kv.all_free


def test_n_children_greedy_identical_seeded_reproducible(llm):
    greedy = llm.generate(["alpha beta"], SamplingParams(n=3, temperature=0.0, max_tokens=8,
                                                         ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in greedy.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in greedy.outputs}) == 1
    seeded = SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    a = llm.generate(["alpha beta"], seeded, use_tqdm=False)[0]
    b = llm.generate(["alpha beta"], seeded, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # children differ
    # child i is exactly a single request with seed + i
    alone = llm.generate(["alpha beta"], child_params(seeded, 2), use_tqdm=False)[0]
    assert alone.outputs[0].token_ids == a.outputs[2].token_ids
    assert llm.scheduler.kv.all_free


def test_children_hold_their_own_kv_and_abort_together():
    engine = LLMEngine("tiny", EngineConfig().replace(max_model_len=128, num_gpu_blocks=64,
                                                      block_size=16))
    params = SamplingParams(n=4, temperature=0.8, max_tokens=50, ignore_eos=True)
    children = engine.add_parallel(list(range(3, 40)), params, "p")
    assert [c.request_id for c in children] == ["0_p", "1_p", "2_p", "3_p"]
    engine.step()  # the first child computes the prompt; the others find it cached
    engine.step()
    kv = engine.scheduler.kv
    tables = [kv.block_table(c.request_id) for c in children]
    assert all(len(t) == 3 for t in tables)  # 37 prompt tokens: 3 blocks each
    assert len({tuple(t[:2]) for t in tables}) == 1  # the full blocks: shared, as vLLM
    assert len({t[2] for t in tables}) == 4  # each writes its own last block
    assert engine.abort_request("p")
    ended = engine.step().finished
    assert {r.request_id for r in ended} == {c.request_id for c in children}
    assert all(r.finish_reason.value == "abort" for r in ended)
    assert kv.all_free and not engine.has_unfinished() and engine.output.is_empty


def test_simulator_accounts_children_kv():
    """The simulator's runner samples nothing but takes every param; n children hold n
    sequences of KV there too."""
    config = EngineConfig().replace(max_model_len=256, num_gpu_blocks=200, block_size=16)
    runner = SimRunner(ConstantCost(0.01))
    core = EngineCore(config, runner, VirtualClock(), 200)
    params = SamplingParams(n=3, max_tokens=20, min_tokens=5, logprobs=5, prompt_logprobs=2,
                            repetition_penalty=1.2, min_p=0.1, seed=1)
    for k in range(3):
        child = Request(f"{k}_p", [1] * 64, child_params(params, k), 0.0, eos_token_id=0,
                        parent_id="p", index=k)
        assert core.add_request(child)
        runner.register(child.request_id, 2)  # its "model" stops after 2 tokens
    core.step()
    kv = core.scheduler.kv
    assert kv.num_gpu_blocks - kv.num_free_blocks == 3 * 4  # 64 prompt tokens: 4 blocks each
    ended = []
    while core.has_unfinished():
        ended += core.step().finished
    # min_tokens: the simulated EOS at token 2 does not end them before 5
    assert sorted(r.num_output_tokens for r in ended) == [5, 5, 5]
    assert kv.all_free


def test_min_tokens_and_max_tokens_none(llm):
    eos = llm.engine.runner.eos_token_id
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}],
                       SamplingParams(temperature=0.0, max_tokens=None, min_tokens=10,
                                      stop_token_ids=(eos,)), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) >= 10
    capped = llm.generate([{"prompt_token_ids": list(range(3, 250))}],
                          SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),
                          use_tqdm=False)[0]
    assert len(capped.outputs[0].token_ids) == 256 - 247  # what max_model_len leaves


def test_llm_chat_renders_the_template(llm):
    messages = [{"role": "user", "content": "Hello"}]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    (out,) = llm.chat(messages, params, use_tqdm=False)
    ids = llm.tokenizer.encode_chat(messages)
    assert out.prompt_token_ids == ids
    same = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == same.outputs[0].token_ids
    two = llm.chat([messages, messages + [{"role": "assistant", "content": "Hi"},
                                          {"role": "user", "content": "More"}]],
                   params, use_tqdm=False)
    assert len(two) == 2 and two[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_skip_special_tokens_and_include_stop_str(llm):
    special = llm.tokenizer._tok.token_to_id("<|im_end|>")
    plain = llm.generate([{"prompt_token_ids": [5, 6]}],
                         SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    text = plain.text
    assert text, "the test needs some text"
    stop = text[1:3] if len(text) >= 3 else text
    cut = llm.generate([{"prompt_token_ids": [5, 6]}],
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                      stop=[stop]), use_tqdm=False)[0].outputs[0]
    kept = llm.generate([{"prompt_token_ids": [5, 6]}],
                        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                       stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == cut.text + stop
    # a special token in the output shows only with skip_special_tokens=False
    engine = llm.engine
    req = Request("s", [5], SamplingParams(skip_special_tokens=False), 0.0)
    req.output_token_ids = [special, 5]
    shown = decode_output(engine.tokenizer, req)
    req.sampling_params = SamplingParams()
    assert "<|im_end|>" in shown and "<|im_end|>" not in decode_output(engine.tokenizer, req)
