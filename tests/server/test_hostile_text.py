"""Hostile text on /tokenize and /detokenize: a text or id list is bounded like a prompt
(the text-size check, then max_model_len tokens), a lone surrogate or an integer literal
of thousands of digits is a 400 naming the field, and a stream running meanwhile is not
held up (the size check runs before any tokenizing; tokenizing runs off the event loop).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import serve_process
from stall_watch import StreamWatch, assert_no_stall, watching

# measures inter-token gaps: runs alone, after the parallel part of the suite
pytestmark = pytest.mark.serial

TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
JSON = {"content-type": "application/json"}
DIGITS_5000 = "9" * 5000


def raw(data: dict) -> bytes:
    return json.dumps(data).encode()


# (name, path, body, param the 400 names)
CASES = [
    ("4 MB text", TOKENIZE, raw({"prompt": "x " * 2_000_000}), "prompt"),
    ("text under the size check, over max_model_len tokens", TOKENIZE,
     raw({"prompt": "hi " * 400}), "prompt"),
    ("chat over max_model_len tokens", TOKENIZE,
     raw({"messages": [{"role": "user", "content": "hi " * 400}]}), "messages"),
    ("lone surrogate", TOKENIZE, raw({"prompt": "ab\ud800cd"}), "prompt"),
    ("lone surrogate in chat", TOKENIZE,
     raw({"messages": [{"role": "user", "content": "ab\udfffcd"}]}), "messages.0.content"),
    ("5,000-digit integer to /tokenize", TOKENIZE,
     f'{{"prompt": "hi", "add_special_tokens": {DIGITS_5000}}}'.encode(),
     "add_special_tokens"),
    ("5,000-digit token id to /detokenize", DETOKENIZE,
     f'{{"tokens": [1, {DIGITS_5000}]}}'.encode(), "tokens.1"),
    ("more ids than max_model_len to /detokenize", DETOKENIZE, raw({"tokens": [5] * 300}),
     "tokens"),
]


@pytest.fixture(scope="module")
def server():
    with serve_process() as s:
        yield s


@pytest.mark.timing  # the inter-token gaps' bound is the point
def test_hostile_text_is_a_400_without_stalling_a_stream(server):
    watch = StreamWatch(server.url)
    slow = []
    with watching(watch) as window, httpx.Client(timeout=30) as client:
        # every case at least twice, and until the stream has shown enough gaps to judge
        rounds = 0
        while rounds < 2 or (len(watch.gaps_between(window.start, time.perf_counter())) <= 30
                             and rounds < 20):
            rounds += 1
            for name, path, body, param in CASES:
                t0 = time.perf_counter()
                r = client.post(server.url + path, content=body, headers=JSON)
                elapsed = time.perf_counter() - t0
                assert r.status_code == 400, (name, r.status_code, r.text[:300])
                assert r.json()["error"]["param"] == param, (name, r.text[:300])
                if elapsed > 1.0:
                    slow.append((name, round(elapsed, 2)))
    assert not slow, f"answered in over 1 s: {slow}"
    assert_no_stall(watch, window)

    # four 4 MB texts at once (they once tokenized to 3 M ids each, for seconds): each
    # refused before any tokenizing. Not under the watcher: four 4 MB bodies cost four
    # JSON parses, as on any endpoint.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: httpx.post(
            server.url + TOKENIZE, content=CASES[0][2], headers=JSON, timeout=30), range(4)))
    assert [a.status_code for a in answers] == [400] * 4
    assert all(a.json()["error"]["code"] == "context_length_exceeded" for a in answers)

    ok = httpx.post(server.url + TOKENIZE, json={"prompt": "Hello"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["count"] >= 1
    back = httpx.post(server.url + DETOKENIZE, json={"tokens": ok.json()["tokens"]},
                      timeout=30)
    assert back.status_code == 200 and back.json()["prompt"] == "Hello"
