"""vLLM's request surface through the official openai client against a real server:
n choices, logprobs and top_logprobs equal to a transformers forward pass of the same
tokens, echo with the prompt's logprobs, vLLM's extra_body fields acting, unknown fields
ignored with a warning, /tokenize, /detokenize, /version, and --api-key."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
import torch
from server_harness import MODEL, serve

from stepserve import SamplingParams

TOL = 1e-4
PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Name a capital city."}]


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from stepserve.model.presets import resolve_model

    hf_logging.set_verbosity_error()
    return AutoModelForCausalLM.from_pretrained(resolve_model(MODEL),
                                                dtype=torch.float32).eval()


def reference(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log P(next | ids[:p + 1]) from transformers."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def text_of(served, token_id: int) -> str:
    return served.engine.tokenizer.decode([token_id], skip_special_tokens=False)


def test_n_choices_greedy_identical_and_seeded_reproducible(served):
    c = served.client()
    greedy = c.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert [ch.index for ch in greedy.choices] == [0, 1, 2]
    assert len({ch.text for ch in greedy.choices}) == 1
    assert greedy.usage.completion_tokens == 24
    seeded = dict(model=MODEL, messages=CHAT, n=3, max_tokens=12, temperature=1.0, seed=7,
                  extra_body={"ignore_eos": True})
    a = c.chat.completions.create(**seeded)
    b = c.chat.completions.create(**seeded)
    texts = [ch.message.content for ch in a.choices]
    assert texts == [ch.message.content for ch in b.choices]
    assert len(set(texts)) > 1  # each child draws with its own seed
    # streamed: the same three texts, chunks tagged by index
    parts = {0: "", 1: "", 2: ""}
    finished = set()
    for chunk in c.chat.completions.create(**seeded, stream=True):
        for ch in chunk.choices:
            parts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert [parts[i] for i in range(3)] == texts and finished == {0, 1, 2}
    served.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_match_transformers(served, hf, offline_llm, stream):
    c = served.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    if stream:
        text, tokens, offsets, values, tops = "", [], [], [], []
        for chunk in c.completions.create(**kw, stream=True):
            for ch in chunk.choices:
                text += ch.text
                if ch.logprobs:
                    tokens += ch.logprobs.tokens
                    offsets += ch.logprobs.text_offset
                    values += ch.logprobs.token_logprobs
                    tops += ch.logprobs.top_logprobs
    else:
        r = c.completions.create(**kw)
        lp = r.choices[0].logprobs
        text, tokens, offsets, values, tops = (r.choices[0].text, lp.tokens, lp.text_offset,
                                               lp.token_logprobs, lp.top_logprobs)
    ids = served.engine.tokenizer.encode(PROMPT)
    gen = greedy_ids(offline_llm, ids, 6)
    ref = reference(hf, ids + gen)
    assert tokens == [text_of(served, t) for t in gen]
    assert offsets == [sum(len(t) for t in tokens[:k]) for k in range(6)]
    assert "".join(tokens) == text or text == offline_llm.tokenizer.decode(gen)
    for k, tok in enumerate(gen):
        row = ref[len(ids) - 1 + k]
        assert values[k] == pytest.approx(row[tok].item(), abs=TOL)
        top = row.topk(3)
        seen = set()
        for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True):
            key = text_of(served, t)
            if key not in seen:  # alike texts share a key; the likelier one holds it
                assert tops[k][key] == pytest.approx(v, abs=TOL)
            seen.add(key)
        assert text_of(served, tok) in tops[k]  # the token itself is always there


def greedy_ids(offline_llm, prompt_ids: list[int], n: int) -> list[int]:
    """The tokens greedy decoding gives, from the same model offline (the served engine
    belongs to its thread)."""
    out = offline_llm.generate([{"prompt_token_ids": prompt_ids}],
                               SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                               use_tqdm=False)
    return out[0].outputs[0].token_ids


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_match_transformers(served, hf, offline_llm, stream):
    c = served.client()
    kw = dict(model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
              top_logprobs=4, extra_body={"ignore_eos": True})
    if stream:
        content = []
        for chunk in c.chat.completions.create(**kw, stream=True):
            for ch in chunk.choices:
                if ch.logprobs and ch.logprobs.content:
                    content += ch.logprobs.content
    else:
        content = c.chat.completions.create(**kw).choices[0].logprobs.content
    ids = served.engine.tokenizer.encode_chat([dict(m) for m in CHAT])
    gen = greedy_ids(offline_llm, ids, 5)
    ref = reference(hf, ids + gen)
    assert len(content) == 5
    for k, (entry, tok) in enumerate(zip(content, gen, strict=True)):
        row = ref[len(ids) - 1 + k]
        assert entry.token == text_of(served, tok)
        assert entry.logprob == pytest.approx(row[tok].item(), abs=TOL)
        assert entry.bytes == list(entry.token.encode())
        top = row.topk(4)
        assert [t.token for t in entry.top_logprobs] == [text_of(served, t)
                                                         for t in top.indices.tolist()]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            top.values.tolist(), abs=TOL)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_zero_tokens_returns_the_prompts_logprobs(served, hf, stream):
    c = served.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    if stream:
        text, tokens, values, tops = "", [], [], []
        for chunk in c.completions.create(**kw, stream=True):
            for ch in chunk.choices:
                text += ch.text
                if ch.logprobs:
                    tokens += ch.logprobs.tokens
                    values += ch.logprobs.token_logprobs
                    tops += ch.logprobs.top_logprobs
    else:
        r = c.completions.create(**kw)
        assert r.usage.completion_tokens == 0
        lp = r.choices[0].logprobs
        text, tokens, values, tops = (r.choices[0].text, lp.tokens, lp.token_logprobs,
                                      lp.top_logprobs)
    ids = served.engine.tokenizer.encode(PROMPT)
    ref = reference(hf, ids)
    assert text == PROMPT
    assert tokens == [text_of(served, t) for t in ids]
    assert values[0] is None and tops[0] is None  # nothing predicts the first token
    for p in range(1, len(ids)):
        assert values[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=TOL)
        best = int(ref[p - 1].argmax())
        assert tops[p][text_of(served, best)] == pytest.approx(ref[p - 1, best].item(),
                                                              abs=TOL)
    served.wait_idle()


def test_echo_with_generation_and_prompt_logprobs_extra(served):
    c = served.client()
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                             echo=True, extra_body={"ignore_eos": True, "prompt_logprobs": 2})
    ch = r.choices[0]
    assert ch.text.startswith(PROMPT) and len(ch.text) > len(PROMPT)
    prompt_lp = ch.model_extra["prompt_logprobs"]
    ids = served.engine.tokenizer.encode(PROMPT)
    assert prompt_lp[0] is None and len(prompt_lp) == len(ids)
    assert all(str(ids[p]) in prompt_lp[p] for p in range(1, len(ids)))


def test_vllm_extra_fields_pass_and_act(served, offline_llm, caplog):
    c = served.client()
    base = dict(model=MODEL, prompt=PROMPT, temperature=0)
    plain = c.completions.create(**base, max_tokens=20)
    n_plain = plain.usage.completion_tokens
    # min_tokens: generation cannot stop before it (EOS masked)
    forced = c.completions.create(**base, max_tokens=30, extra_body={"min_tokens": 25})
    assert forced.usage.completion_tokens >= 25
    # ignore_eos: runs to max_tokens
    long = c.completions.create(**base, max_tokens=30, extra_body={"ignore_eos": True})
    assert long.usage.completion_tokens == 30 and long.choices[0].finish_reason == "length"
    # stop_token_ids: the second generated token ends it
    tok = served.engine.tokenizer
    second = greedy_ids(offline_llm, tok.encode(PROMPT), 2)[1]
    stopped = c.completions.create(**base, max_tokens=20, extra_body={
        "stop_token_ids": [second], "ignore_eos": True})
    assert stopped.usage.completion_tokens == 2 and stopped.choices[0].finish_reason == "stop"
    # repetition_penalty changes a greedy text; min_p=1 keeps only the top token
    rep = c.completions.create(**base, max_tokens=30, extra_body={
        "repetition_penalty": 1.8, "ignore_eos": True})
    assert rep.choices[0].text != long.choices[0].text
    top_only = c.completions.create(model=MODEL, prompt=PROMPT, temperature=1.5, seed=3,
                                    max_tokens=30, extra_body={"min_p": 1.0,
                                                               "ignore_eos": True})
    assert top_only.choices[0].text == long.choices[0].text
    # include_stop_str_in_output, request_id, skip_special_tokens
    stop = long.choices[0].text[3:6]
    cut = c.completions.create(**base, max_tokens=30, stop=[stop],
                               extra_body={"ignore_eos": True})
    kept = c.completions.create(**base, max_tokens=30, stop=[stop], extra_body={
        "ignore_eos": True, "include_stop_str_in_output": True, "request_id": "abc-123",
        "skip_special_tokens": False})
    assert kept.choices[0].text == cut.choices[0].text + stop
    assert kept.id == "cmpl-abc-123"
    # model is optional; unknown fields are ignored with a warning naming them
    with caplog.at_level(logging.WARNING, logger="stepserve.server"):
        r = httpx.post(served.base_url + "/completions", json={
            "prompt": PROMPT, "max_tokens": 2, "frobnicate": 1, "guided_json": None})
    assert r.status_code == 200, r.text
    assert any("frobnicate" in m and "guided_json" in m for m in caplog.messages)
    assert n_plain >= 1
    served.wait_idle()


def test_tokenize_detokenize_version(served):
    tok = served.engine.tokenizer
    r = httpx.post(served.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT,
                                                    "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode(PROMPT) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 256 and len(r["token_strs"]) == r["count"]
    chat = httpx.post(served.url + "/tokenize", json={"messages": CHAT}).json()
    assert chat["tokens"] == tok.encode_chat([dict(m) for m in CHAT])
    back = httpx.post(served.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back == {"prompt": PROMPT}
    bad = httpx.post(served.url + "/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert httpx.post(served.url + "/tokenize", json={"model": "x", "prompt": "a"}
                      ).status_code == 404
    assert "version" in httpx.get(served.url + "/version").json()


def test_api_key_guards_everything_but_health_and_metrics():
    with serve(api_keys=["sesame", "other"]) as s:
        wrong = openai.OpenAI(base_url=s.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.completions.create(model=MODEL, prompt="hi", max_tokens=1)
        assert e.value.status_code == 401
        body = e.value.body
        assert set(body) == {"message", "type", "param", "code"}
        missing = httpx.post(s.base_url + "/completions", json={"prompt": "hi"})
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(s.base_url + "/models").status_code == 401
        assert httpx.post(s.url + "/tokenize", json={"prompt": "a"}).status_code == 401
        for path in ("/health", "/metrics", "/version"):
            assert httpx.get(s.url + path).status_code == 200, path
        for key in ("sesame", "other"):
            ok = openai.OpenAI(base_url=s.base_url, api_key=key, max_retries=0)
            assert ok.completions.create(model=MODEL, prompt="hi",
                                         max_tokens=1).choices[0].text is not None
        s.wait_idle()


def test_api_key_flag_and_environment(monkeypatch, capsys):
    from stepserve.cli import build_parser
    from stepserve.cli.serve import api_keys_of

    parser = build_parser()
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert api_keys_of(parser.parse_args(["serve", "--api-key", "a", "--api-key", "b"])) \
        == ("a", "b")
    assert api_keys_of(parser.parse_args(["serve"])) == ()
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert api_keys_of(parser.parse_args(["serve"])) == ("from-env",)
    assert api_keys_of(parser.parse_args(["serve", "--api-key", "flag"])) == ("flag",)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["serve", "--api-key", " "])
    assert e.value.code == 2 and "empty" in capsys.readouterr().err


def test_best_of_returns_the_likeliest_of_its_sequences(served):
    c = served.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11,
              extra_body={"ignore_eos": True})
    every = c.completions.create(**kw, n=4, logprobs=0)
    totals = {ch.index: sum(ch.logprobs.token_logprobs) for ch in every.choices}
    best = sorted(totals, key=lambda i: -totals[i])[:2]
    r = c.completions.create(**kw, n=2, best_of=4)
    assert [ch.index for ch in r.choices] == [0, 1]
    assert [ch.text for ch in r.choices] == [every.choices[i].text for i in best]
    assert r.choices[0].logprobs is None  # ranked by logprobs, shown only when asked
    assert r.usage.completion_tokens == 4 * 8
    served.wait_idle()


def test_a_client_leaving_an_n_stream_aborts_every_child(served):
    """n = 3 children, 200 tokens each: the client reads one chunk and goes; every child
    ends (aborted), every block comes back."""
    def aborted() -> float:
        return served.metric("stepserve:request_success_total", finished_reason="abort")

    before = aborted()
    body = {"prompt": PROMPT, "n": 3, "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", served.base_url + "/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break
    served.wait_idle()
    assert served.metrics()["stepserve:num_gpu_blocks_used"] == 0
    assert served.engine.scheduler.kv.all_free
    assert served.engine.output.is_empty  # the parent's bookkeeping is gone too
    assert aborted() == before + 3  # each child ended, as aborted
