"""Hostile inputs: each gets its 4xx in OpenAI's error shape within a second, the server
stays healthy and holds no block afterwards, and a stream running meanwhile is not held
up by more than about one engine step (nothing heavy runs on the event loop)."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest
from server_harness import MODEL, serve_process
from stall_watch import StreamWatch, assert_no_stall, watching

# measures inter-token gaps: runs alone, after the parallel part of the suite
pytestmark = pytest.mark.serial

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = {"content-type": "application/json"}
PROMPT = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
CHAT_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
HUGE = 2**64

NUMERIC = {  # field -> endpoint whose body takes it
    "max_tokens": COMPLETIONS, "temperature": COMPLETIONS, "top_p": COMPLETIONS,
    "top_k": COMPLETIONS, "seed": COMPLETIONS, "priority": COMPLETIONS, "n": COMPLETIONS,
    "frequency_penalty": CHAT, "presence_penalty": CHAT, "max_completion_tokens": CHAT,
    "logprobs": COMPLETIONS, "top_logprobs": CHAT,
}


def raw(base: dict, **changes) -> bytes:
    return json.dumps({**base, **changes}).encode()


def numeric_cases() -> list[tuple]:
    cases = []
    for field, path in NUMERIC.items():
        base = PROMPT if path == COMPLETIONS else CHAT_BODY
        text = json.dumps(base)[:-1]
        for label, literal in (("huge", str(HUGE)), ("-huge", str(-HUGE)), ("NaN", "NaN"),
                               ("inf", "1e400")):
            body = f'{text}, "{field}": {literal}}}'.encode()
            cases.append((f"{field}={label}", path, body, JSON, 400))
    return cases


def with_literal(base: dict, field: str, literal: str) -> bytes:
    """`base` with `field` set to a JSON literal as written (json.dumps cannot write a
    5,000-digit integer: Python's int-string limit)."""
    return json.dumps({**base, field: "<literal>"}).replace('"<literal>"', literal).encode()


LONE = "ab\ud800cd"  # json.dumps writes it as the escape \ud800 with no low half after it
DIGITS_5000 = "9" * 5000
VOCAB = 512  # the tiny model's


def nested(depth: int) -> bytes:
    return ('{"model": "tiny", "prompt": ' + "[" * depth + "1" + "]" * depth + "}").encode()


CASES = numeric_cases() + [
    ("top_k 2^63 (killed the engine once)", COMPLETIONS,
     raw(PROMPT, top_k=9223372036854775808), JSON, 400),
    ("10 MB body", COMPLETIONS, raw(PROMPT, prompt="a" * 10_000_000), JSON, 413),
    ("1M-character prompt", COMPLETIONS, raw(PROMPT, prompt="word " * 200_000), JSON, 400),
    ("1M-character chat message", CHAT,
     raw(CHAT_BODY, messages=[{"role": "user", "content": "x" * 1_000_000}]), JSON, 400),
    ("100k stop strings", COMPLETIONS, raw(PROMPT, stop=["x"] * 100_000), JSON, 400),
    ("40 stop strings", COMPLETIONS, raw(PROMPT, stop=["x"] * 40), JSON, 400),
    ("a 2k-character stop string", COMPLETIONS, raw(PROMPT, stop="s" * 2000), JSON, 400),
    ("10k messages", CHAT, raw(CHAT_BODY, messages=[{"role": "user", "content": "hi"}]
                              * 10_000), JSON, 400),
    ("100k stop_token_ids", COMPLETIONS, raw(PROMPT, stop_token_ids=[1] * 100_000), JSON,
     400),
    ("stop_token_id out of vocab", COMPLETIONS, raw(PROMPT, stop_token_ids=[10**6]), JSON,
     400),
    ("1 MB user (tenant)", COMPLETIONS, raw(PROMPT, user="u" * 1_000_000), JSON, 400),
    ("300-character user", COMPLETIONS, raw(PROMPT, user="u" * 300), JSON, 400),
    ("chat message without content", CHAT, raw(CHAT_BODY, messages=[{"role": "user"}]),
     JSON, 400),
    ("system message with null content", CHAT,
     raw(CHAT_BODY, messages=[{"role": "system", "content": None}]), JSON, 400),
    ("deep nesting", COMPLETIONS, nested(100_000), JSON, 400),
    ("nesting in a token list", COMPLETIONS, nested(50), JSON, 400),
    ("duplicate keys", COMPLETIONS, b'{"model": "tiny", "prompt": "a", "prompt": "b"}', JSON,
     400),
    ("a million commas' worth of token ids", COMPLETIONS,
     raw(PROMPT, prompt=[1] * 1_000_000), JSON, 400),
    ("text/plain body", COMPLETIONS, raw(PROMPT), {"content-type": "text/plain"}, 415),
    ("form body", CHAT, b"model=tiny", {"content-type": "application/x-www-form-urlencoded"},
     415),
    ("no content type", COMPLETIONS, raw(PROMPT), {}, 415),
    ("non-UTF-8 bytes", COMPLETIONS, b'{"model": "tiny", "prompt": "\xff\xfe\xfd"}', JSON, 400),
    ("UTF-16 body", COMPLETIONS, json.dumps(PROMPT).encode("utf-16"), JSON, 400),
    ("empty body", COMPLETIONS, b"", JSON, 400),
    ("JSON null", COMPLETIONS, b"null", JSON, 400),
    ("JSON string", CHAT, b'"hello"', JSON, 400),
    ("truncated JSON", CHAT, raw(CHAT_BODY)[:-5], JSON, 400),
    ("token ids as strings", COMPLETIONS, raw(PROMPT, prompt=["1", 2]), JSON, 400),
    ("negative token id", COMPLETIONS, raw(PROMPT, prompt=[-1]), JSON, 400),
    ("token id 2^40", COMPLETIONS, raw(PROMPT, prompt=[2**40]), JSON, 400),
    ("logit_bias with 10k entries", CHAT,
     raw(CHAT_BODY, logit_bias={str(i): 1.0 for i in range(10_000)}), JSON, 400),
    ("model name of 1 MB", COMPLETIONS, raw(PROMPT, model="m" * 1_000_000), JSON, 400),
    # text that is not valid Unicode (a lone surrogate), wherever it is
    ("lone surrogate in a prompt", COMPLETIONS, raw(PROMPT, prompt=LONE), JSON, 400),
    ("lone surrogate in chat content", CHAT,
     raw(CHAT_BODY, messages=[{"role": "user", "content": LONE}]), JSON, 400),
    ("lone surrogate in a content part", CHAT,
     raw(CHAT_BODY, messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
     JSON, 400),
    ("lone surrogate echoed", COMPLETIONS, raw(PROMPT, prompt=LONE, echo=True), JSON, 400),
    ("lone surrogate in a stop string", COMPLETIONS, raw(PROMPT, stop=[LONE]), JSON, 400),
    # integer literals past Python's int-string limit (4,300 digits)
    ("5,000-digit max_tokens", COMPLETIONS, with_literal(PROMPT, "max_tokens", DIGITS_5000),
     JSON, 400),
    ("5,000-digit seed", COMPLETIONS, with_literal(PROMPT, "seed", DIGITS_5000), JSON, 400),
    # features refused, not ignored
    ("legacy functions", CHAT, raw(CHAT_BODY, functions=[{"name": "f", "parameters": {}}]),
     JSON, 400),
    ("legacy function_call", CHAT, raw(CHAT_BODY, function_call="auto"), JSON, 400),
    ("gzip-encoded body", COMPLETIONS, gzip.compress(raw(PROMPT)),
     {**JSON, "content-encoding": "gzip"}, 415),
    ("stop_token_ids over the whole vocabulary with min_tokens", COMPLETIONS,
     raw(PROMPT, stop_token_ids=list(range(VOCAB)), min_tokens=2), JSON, 400),
]


@pytest.fixture(scope="module")
def server():
    """Its own process: the client's work in this process cannot delay its streams."""
    with serve_process() as s:
        yield s


def test_at_least_forty_hostile_inputs():
    assert len(CASES) >= 40


@pytest.mark.timing  # the inter-token gaps' bound is the point
def test_hostile_inputs_answered_fast_without_stalling_a_stream(server):
    watch = StreamWatch(server.url)
    slow = []
    with watching(watch) as window, httpx.Client(timeout=30) as client:
        for name, path, body, headers, status in CASES * 2:
            t0 = time.perf_counter()
            r = client.post(server.url + path, content=body, headers=headers)
            elapsed = time.perf_counter() - t0
            assert r.status_code == status, (name, r.status_code, r.text[:300])
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}, name
            assert err["message"], name
            if elapsed > 1.0:
                slow.append((name, round(elapsed, 2)))
    assert not slow, f"answered in over 1 s: {slow}"
    assert_no_stall(watch, window)

    assert httpx.get(server.url + "/health").status_code == 200
    server.wait_idle()
    assert server.metrics()["stepserve:num_gpu_blocks_used"] == 0


@pytest.mark.parametrize("size", [5_000_000])
def test_chunked_body_over_the_limit_is_cut_off(server, size):
    def chunks():
        head = b'{"model": "tiny", "prompt": "'
        yield head
        for _ in range(size // 65536):
            yield b"a" * 65536
        yield b'"}'

    r = httpx.post(server.url + COMPLETIONS, content=chunks(), headers=JSON, timeout=30)
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"]["code"] == "body_too_large"
