"""The engine's public surface on the tiny model: LLM.generate in vLLM's shape, stop
conditions, rejections, the generate/models/demo commands."""

from __future__ import annotations

import json

import pytest

from stepserve import LLM, SamplingParams
from stepserve.cli import main
from stepserve.config.settings import ConfigError
from stepserve.core.request import RequestStatus


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, max_num_seqs=8)


def greedy(n=8, **kw):
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def test_generate_returns_outputs_in_input_order_in_vllms_shape(llm):
    prompts = ["alpha beta", {"prompt_token_ids": [5, 6, 7]}, "gamma"]
    outs = llm.generate(prompts, greedy(6, ignore_eos=True), use_tqdm=False)
    assert [o.prompt for o in outs] == ["alpha beta", None, "gamma"]
    assert outs[1].prompt_token_ids == [5, 6, 7]
    for o in outs:
        assert len(o.outputs[0].token_ids) == 6 and o.outputs[0].finish_reason == "length"
        assert o.outputs[0].text == llm.tokenizer.decode(o.outputs[0].token_ids)
    # same prompt alone gives the same tokens: batching does not change greedy output
    alone = llm.generate(["gamma"], greedy(6, ignore_eos=True), use_tqdm=False)
    assert alone[0].outputs[0].token_ids == outs[2].outputs[0].token_ids
    assert llm.scheduler.kv.all_free


def test_stop_token_ids_and_stop_strings_end_requests(llm):
    base = llm.generate(["stop here"], greedy(10, ignore_eos=True), use_tqdm=False)[0]
    ids = base.outputs[0].token_ids
    out = llm.generate(["stop here"], greedy(10, ignore_eos=True, stop_token_ids=(ids[3],)),
                       use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids == ids[:ids.index(ids[3]) + 1]
    text = base.outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if stop.strip():
        out = llm.generate(["stop here"], greedy(10, ignore_eos=True, stop=(stop,)),
                           use_tqdm=False)[0]
        assert out.outputs[0].finish_reason == "stop" and stop not in out.outputs[0].text
        assert out.outputs[0].text == text[:text.find(stop)]


def test_a_prompt_too_long_raises_before_anything_runs(llm):
    with pytest.raises(ValueError, match="exceeds max_model_len = 128"):
        llm.generate(["ok", {"prompt_token_ids": [5] * 200}], greedy(4), use_tqdm=False)
    assert not llm.scheduler.has_unfinished() and llm.scheduler.kv.all_free


def test_engine_rejects_bad_token_ids_and_settings():
    with pytest.raises(ConfigError, match="max_num_seqs = 0"):
        LLM("tiny", max_num_seqs=0)
    with pytest.raises(ConfigError, match="unknown setting 'max_num_seq'"):
        LLM("tiny", max_num_seq=4)
    eng = LLM("tiny", max_model_len=64).engine
    with pytest.raises(ValueError, match="prompt token ids must be integers"):
        eng.add_request([1, -3], greedy())


def test_abort_frees_blocks(llm):
    eng = llm.engine
    req = eng.add_request("abort me please", greedy(50, ignore_eos=True))
    eng.step()
    assert eng.abort_request(req.request_id)
    assert req.status is RequestStatus.FINISHED_ABORTED
    eng.run_until_done()
    assert eng.scheduler.kv.all_free


def test_generate_and_models_commands(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "hi", "--max-tokens", "5",
                 "--ignore-eos"]) == 0
    captured = capsys.readouterr()
    assert "5 tokens, finish_reason=length" in captured.err
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert {m["name"] for m in models} >= {"default", "tiny"}
    assert all(m["path"] for m in models)


def test_demo_runs_end_to_end_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "demo.json"
    rc = main(["demo", "--model", "tiny", "--requests", "80", "--short", "2", "--long", "20",
               "--sim-requests", "640", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "continuous / static throughput" in text and "why they differ" in text
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["runs"]]
    assert names == ["cpu-static", "cpu-continuous", "h100-sim-static", "h100-sim-continuous"]
    static, cont = data["runs"][0]["summary"], data["runs"][1]["summary"]
    assert static["output_tokens"] == cont["output_tokens"]
    assert static["slot_utilization"] < 0.5 < cont["slot_utilization"]
    assert data["comparison"]["sim_speedup"] > 2
