"""A table of bad inputs: each gets its 4xx in OpenAI's error shape, naming the field
where there is one; afterwards the server is healthy and holds no KV block."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from server_harness import MODEL

from stepserve.core.end_reasons import Refusal, RejectReason, end_reason, refusal_of_error

OK_PROMPT = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
JSON = {"content-type": "application/json"}


def body(base: dict, **changes) -> bytes:
    data = {**base, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not ...}).encode()


def literal(base: dict, field: str, text: str) -> bytes:
    """`base` with `field` written as the JSON text `text` (json.dumps cannot write an
    integer past Python's int-string limit)."""
    return json.dumps({**base, field: "<literal>"}).replace('"<literal>"', text).encode()


TINY_EOS = 2  # the tiny model's EOS id (its vocabulary: 512)
LONE = "ab\ud800cd"  # json.dumps writes the escape \ud800 with no low half after it


# (name, path, raw body, headers, status, param (None: no field to name), words in message)
CASES = [
    ("malformed JSON", COMPLETIONS, b'{"model": "tiny", "prompt": ', JSON, 400, None,
     "JSON"),
    ("JSON array, not object", COMPLETIONS, b"[1, 2]", JSON, 400, None, "object"),
    ("max_tokens as string", COMPLETIONS, body(OK_PROMPT, max_tokens="10"), JSON, 400,
     "max_tokens", "integer"),
    ("negative max_tokens", CHAT, body(OK_CHAT, max_tokens=-3), JSON, 400,
     "max_tokens", "greater than or equal to 1"),
    ("zero max_tokens", COMPLETIONS, body(OK_PROMPT, max_tokens=0), JSON, 400, "max_tokens",
     "1"),
    ("temperature too high", COMPLETIONS, body(OK_PROMPT, temperature=3.5), JSON, 400,
     "temperature", "less than or equal to 2"),
    ("negative temperature", CHAT, body(OK_CHAT, temperature=-0.1), JSON, 400, "temperature",
     "0"),
    ("top_p zero", COMPLETIONS, body(OK_PROMPT, top_p=0.0), JSON, 400, "top_p", "greater"),
    ("top_k below -1", COMPLETIONS, body(OK_PROMPT, top_k=-5), JSON, 400, "top_k", "-1"),
    ("unknown model", COMPLETIONS, body(OK_PROMPT, model="gpt-9"), JSON, 404, "model",
     "gpt-9"),
    ("empty prompt", COMPLETIONS, body(OK_PROMPT, prompt=""), JSON, 400, "prompt", "empty"),
    ("empty token list", COMPLETIONS, body(OK_PROMPT, prompt=[]), JSON, 400, "prompt",
     "empty"),
    ("prompt over max_model_len", COMPLETIONS, body(OK_PROMPT, prompt=[5] * 300), JSON, 400,
     "prompt", "300 tokens"),
    ("huge max_tokens", COMPLETIONS, body(OK_PROMPT, max_tokens=10**6), JSON, 400,
     "max_tokens", "max_model_len = 256"),
    ("token id out of vocab", COMPLETIONS, body(OK_PROMPT, prompt=[1, 99999]), JSON, 400,
     "prompt", "99999"),
    ("too many prompts", COMPLETIONS, body(OK_PROMPT, prompt=["a"] * 257), JSON, 400,
     "prompt", "at most 256"),
    ("an empty prompt in a list", COMPLETIONS, body(OK_PROMPT, prompt=["a", ""]), JSON, 400,
     "prompt", "prompt[1] is empty"),
    ("a list prompt's token id out of vocab", COMPLETIONS,
     body(OK_PROMPT, prompt=[[1, 2], [1, 99999]]), JSON, 400, "prompt", "99999"),
    ("n over the limit", COMPLETIONS, body(OK_PROMPT, n=1000), JSON, 400, "n", "128"),
    ("best_of below n", COMPLETIONS, body(OK_PROMPT, best_of=1, n=2), JSON, 400, "best_of",
     ">= n"),
    ("best_of streamed", COMPLETIONS, body(OK_PROMPT, best_of=3, stream=True), JSON, 400,
     "best_of", "streamed"),
    ("logprobs over 20", COMPLETIONS, body(OK_PROMPT, logprobs=50), JSON, 400, "logprobs",
     "20"),
    ("top_logprobs without logprobs", CHAT, body(OK_CHAT, top_logprobs=3), JSON, 400,
     "top_logprobs", "logprobs = true"),
    ("penalty out of range", CHAT, body(OK_CHAT, frequency_penalty=2.5), JSON, 400,
     "frequency_penalty", "2"),
    ("zero repetition_penalty", CHAT, body(OK_CHAT, repetition_penalty=0), JSON, 400,
     "repetition_penalty", "greater than 0"),
    ("min_p above 1", COMPLETIONS, body(OK_PROMPT, min_p=1.5), JSON, 400, "min_p", "1"),
    ("min_tokens over max_tokens", COMPLETIONS, body(OK_PROMPT, min_tokens=9), JSON, 400,
     None, "min_tokens"),
    ("unsupported suffix", COMPLETIONS, body(OK_PROMPT, suffix="x"), JSON, 400, "suffix",
     "not supported"),
    ("unsupported logit_bias", CHAT, body(OK_CHAT, logit_bias={"5": 1.0}), JSON, 400,
     "logit_bias", "not supported"),
    ("non-UTF-8 bytes", COMPLETIONS, b'{"model": "tiny", "prompt": "\xff\xfe"}', JSON, 400,
     None, "UTF-8"),
    ("wrong content type", COMPLETIONS, body(OK_PROMPT), {"content-type": "text/plain"}, 415,
     None, "application/json"),
    ("no content type", CHAT, body(OK_CHAT), {}, 415, None, "application/json"),
    ("missing messages", CHAT, body(OK_CHAT, messages=...), JSON, 400, "messages",
     "missing"),
    ("empty messages", CHAT, body(OK_CHAT, messages=[]), JSON, 400, "messages", "at least"),
    ("bad role", CHAT, body(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]), JSON,
     400, "messages.0.role", "wizard"),
    ("message content of wrong type", CHAT,
     body(OK_CHAT, messages=[{"role": "user", "content": 5}]), JSON, 400,
     "messages.0.content", "5"),
    ("stream flag as string", COMPLETIONS, body(OK_PROMPT, stream="yes"), JSON, 400,
     "stream", "boolean"),
    ("stream_options without stream", CHAT,
     body(OK_CHAT, stream_options={"include_usage": True}), JSON, 400, "stream_options",
     "stream"),
    ("stop of wrong type", COMPLETIONS, body(OK_PROMPT, stop=5), JSON, 400, "stop", "5"),
    ("priority as string", COMPLETIONS, body(OK_PROMPT, priority="high"), JSON, 400,
     "priority", "integer"),
    ("max_completion_tokens too big", CHAT, body(OK_CHAT, max_completion_tokens=5000), JSON,
     400, "max_completion_tokens", "5000"),
    # text that is not valid Unicode: the JSON path of the string is named
    ("lone surrogate in a prompt", COMPLETIONS, body(OK_PROMPT, prompt=LONE), JSON, 400,
     "prompt", "lone surrogate (U+D800)"),
    ("lone surrogate in a content part", CHAT, body(OK_CHAT, messages=[
        {"role": "user", "content": [{"type": "text", "text": "ok"},
                                     {"type": "text", "text": LONE}]}]), JSON, 400,
     "messages.0.content.1.text", "valid Unicode"),
    ("lone low surrogate in a stop string", COMPLETIONS,
     body(OK_PROMPT, stop=["fine", "\udc80"]), JSON, 400, "stop.1", "U+DC80"),
    ("lone surrogate in /tokenize", TOKENIZE, body({"prompt": LONE}), JSON, 400, "prompt",
     "lone surrogate"),
    # integer literals longer than any field takes
    ("5,000-digit max_tokens", COMPLETIONS, literal(OK_PROMPT, "max_tokens", "9" * 5000),
     JSON, 400, "max_tokens", "5000 digits"),
    ("21-digit negative seed", COMPLETIONS, literal(OK_PROMPT, "seed", "-" + "9" * 21), JSON,
     400, "seed", "21 digits"),
    ("5,000-digit token id to /detokenize", DETOKENIZE,
     literal({"tokens": [1]}, "tokens", f"[1, {'9' * 5000}]"), JSON, 400, "tokens.1",
     "5000 digits"),
    # /tokenize and /detokenize bounded like a prompt
    ("text over max_model_len tokens to /tokenize", TOKENIZE, body({"prompt": "hi " * 400}),
     JSON, 400, "prompt", "max_model_len = 256"),
    ("chat over max_model_len tokens to /tokenize", TOKENIZE,
     body({"messages": [{"role": "user", "content": "hi " * 400}]}), JSON, 400, "messages",
     "max_model_len = 256"),
    ("more ids than max_model_len to /detokenize", DETOKENIZE, body({"tokens": [5] * 300}),
     JSON, 400, "tokens", "max_model_len = 256"),
    # refused, not ignored
    ("legacy functions", CHAT, body(OK_CHAT, functions=[{"name": "f"}]), JSON, 400,
     "functions", "not supported"),
    ("legacy function_call", CHAT, body(OK_CHAT, function_call={"name": "f"}), JSON, 400,
     "function_call", "not supported"),
    ("gzip-encoded body", COMPLETIONS, gzip.compress(body(OK_PROMPT)),
     {**JSON, "content-encoding": "gzip"}, 415, None, "only 'identity'"),
    ("stop_token_ids and EOS cover the vocabulary, with min_tokens", COMPLETIONS,
     body(OK_PROMPT, stop_token_ids=[t for t in range(512) if t != TINY_EOS], min_tokens=1),
     JSON, 400,
     "stop_token_ids", "whole vocabulary"),
]


@pytest.mark.parametrize("name,path,raw,headers,status,param,words", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_input(served, name, path, raw, headers, status, param, words):
    r = httpx.post(served.url + path, content=raw, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    assert words.lower() in err["message"].lower(), err["message"]
    assert err["type"] in ("invalid_request_error", "not_found_error")
    end = refusal_of_error(r.status_code, err["code"])  # each a counted refusal
    assert end is not None and err["type"] == end.error_type, err
    if end.key is not Refusal.INVALID:  # invalid spans 400, 413 and 415
        assert (r.status_code, err["code"]) == (end.http_status, end.error_code)


def test_wrong_method_and_unknown_route_use_the_error_shape(served):
    for r, status in ((httpx.get(served.url + COMPLETIONS), 405),
                      (httpx.post(served.url + "/v1/nothing", json={}), 404)):
        assert r.status_code == status
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_server_healthy_and_empty_after_bad_inputs(served):
    for _name, path, raw, headers, *_ in CASES:
        httpx.post(served.url + path, content=raw, headers=headers)
    assert httpx.get(served.url + "/health").status_code == 200
    served.wait_idle()
    m = served.metrics()
    assert m["stepserve:num_gpu_blocks_used"] == 0
    for reason in (Refusal.INVALID, RejectReason.TOO_LONG, RejectReason.EMPTY_PROMPT,
                   Refusal.UNKNOWN_MODEL):
        label = end_reason(reason).label
        assert served.metric("stepserve:request_rejected_total", reason=label) > 0, reason
    ok = httpx.post(served.url + COMPLETIONS, content=body(OK_PROMPT), headers=JSON)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
