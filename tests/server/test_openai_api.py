"""The official openai client against a real uvicorn server: completions and chat,
streamed and not, text equal to the offline LLM.generate for the same greedy request."""

from __future__ import annotations

import httpx
import pytest
from server_harness import MODEL

from stepserve.core.request import SamplingParams

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def step(self):"]
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name the capital of France."}]


def offline_text(llm, prompt, max_tokens: int, **kw) -> tuple[str, int, str]:
    out = llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw),
                       use_tqdm=False)[0]
    return out.outputs[0].text, len(out.outputs[0].token_ids), out.outputs[0].finish_reason


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_matches_offline(served, offline_llm, prompt):
    want, n, reason = offline_text(offline_llm, prompt, 24)
    r = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                           temperature=0.0)
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason == reason
    assert r.usage.completion_tokens == n
    assert r.usage.prompt_tokens == len(offline_llm.tokenizer.encode(prompt))
    assert r.usage.total_tokens == r.usage.prompt_tokens + n


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_completion_matches_offline(served, offline_llm, prompt):
    want, n, reason = offline_text(offline_llm, prompt, 24)
    chunks = list(served.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=24, temperature=0.0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == reason and all(f is None for f in finals[:-1])
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == n
    assert all(c.usage is None for c in chunks[:-1])


def test_token_id_prompt_and_stop_string(served, offline_llm):
    ids = offline_llm.tokenizer.encode("One, two, three")
    full, _, _ = offline_text(offline_llm, {"prompt_token_ids": ids}, 24)
    stop = full[5:8]
    want, _, reason = offline_text(offline_llm, {"prompt_token_ids": ids}, 24, stop=[stop])
    client = served.client()
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0.0,
                                  stop=[stop])
    assert r.choices[0].text == want and reason == "stop" == r.choices[0].finish_reason
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ids, max_tokens=24, temperature=0.0, stop=[stop], stream=True))
    assert streamed == want


def test_chat_matches_offline(served, offline_llm):
    ids = offline_llm.tokenizer.encode_chat(MESSAGES)
    want, n, reason = offline_text(offline_llm, {"prompt_token_ids": ids}, 20)
    client = served.client()
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                       max_completion_tokens=20, temperature=0.0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), n)

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0.0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == reason
    assert chunks[-1].usage.completion_tokens == n and chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_without_max_tokens_fills_the_context(served):
    r = served.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0.0,
        extra_body={"ignore_eos": True, "max_tokens": None})
    ctx = served.app.state.ctx
    assert r.usage.prompt_tokens + r.usage.completion_tokens == ctx.max_model_len
    assert r.choices[0].finish_reason == "length"


def test_sampling_with_seed_is_reproducible(served):
    client = served.client()
    kw = dict(model=MODEL, prompt="Hello", max_tokens=16, temperature=1.0, top_p=0.9,
              seed=7, extra_body={"top_k": 50, "ignore_eos": True})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b
    assert client.completions.create(**kw).usage.completion_tokens == 16


def test_models_health_metrics(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    h = httpx.get(served.url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    m = served.metrics()
    for name in ("stepserve:num_requests_running", "stepserve:num_requests_waiting",
                 "stepserve:num_requests_swapped", "stepserve:kv_cache_usage_perc",
                 "stepserve:num_gpu_blocks_used", "stepserve:num_preemptions_total",
                 "stepserve:prompt_tokens_total", "stepserve:generation_tokens_total",
                 "stepserve:request_success_total", "stepserve:time_to_first_token_seconds_count",
                 "stepserve:inter_token_latency_seconds_count",
                 "stepserve:request_time_per_output_token_seconds_count",
                 "stepserve:e2e_request_latency_seconds_count",
                 "stepserve:request_queue_time_seconds_count",
                 "stepserve:request_prefill_time_seconds_count",
                 "stepserve:request_decode_time_seconds_count",
                 "stepserve:iteration_tokens_total_count", "stepserve:prefill_step_share",
                 "stepserve:zero_decode_step_share", "stepserve:active_concurrency_ratio"):
        assert name in m, name
