"""The logprob budget of one request: n x tokens x (top logprobs + 1) over the cap is a
fast 400 stating the product, its factors and the cap; a request just under it completes,
rendered off the event loop, without holding up another client's stream."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_harness import MODEL, serve_process
from stall_watch import StreamWatch, assert_no_stall, watching

from stepserve.server.errors import APIError
from stepserve.server.logprob_budget import (
    DEFAULT_MAX_LOGPROB_ENTRIES,
    chat_ask,
    check_logprob_budget,
    completion_ask,
)
from stepserve.server.protocol import ChatCompletionRequest, CompletionRequest

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
CAP = DEFAULT_MAX_LOGPROB_ENTRIES
ECHO_ATTACK = {"model": MODEL, "prompt": [5] * 4000, "max_tokens": 0, "echo": True,
               "logprobs": 20, "n": 128}
CHAT_ATTACK = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 64,
               "logprobs": True, "top_logprobs": 20, "max_tokens": 1000}
# just under the cap: 128 chat choices of 93 tokens with 20 alternatives each (249,984
# entries: a ~17 MB body at once, or ~1 MB of events a step), light work for the engine
# (decode steps) and heavy for whoever renders it
CHAT_UNDER = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 128,
              "logprobs": True, "top_logprobs": 20, "max_tokens": 93, "ignore_eos": True}

def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": [1], **fields}, strict=True)


def test_completion_ask_counts_what_the_answer_carries():
    echo = completion_ask(completion(**{**ECHO_ATTACK, "prompt": [1]}), 128, 1, True, 4000)
    assert (echo.n, echo.tokens, echo.top) == (128, 4000, 20)  # the hidden token: none
    assert echo.entries == 128 * 4000 * 21
    both = completion_ask(completion(echo=True, logprobs=2, prompt_logprobs=5,
                                     max_tokens=10), 3, 10, False, 100)
    assert (both.tokens, both.top) == (10 + 100 + 100, 5)  # the prompt shown twice
    assert completion_ask(completion(max_tokens=10), 5, 10, False, 100).entries == 0
    best_of = completion_ask(completion(logprobs=0, best_of=8), 8, 16, False, 10)
    assert best_of.entries == 8 * 16 and best_of.parts == (("max_tokens (its default)",
                                                            16),)
    assert best_of.n_param == "best_of"


def test_chat_ask_counts_the_default_max_tokens():
    body = ChatCompletionRequest.model_validate(
        {**CHAT_ATTACK, "max_tokens": None}, strict=True)
    ask = chat_ask(body, "max_tokens", 4000, 20)
    assert ask.entries == 64 * 4000 * 21 and ask.param == "top_logprobs"
    assert ask.parts == (("max_tokens (its default)", 4000),)
    plain = ChatCompletionRequest.model_validate({**CHAT_ATTACK, "logprobs": False,
                                                  "top_logprobs": None}, strict=True)
    assert chat_ask(plain, "max_tokens", 1000, 20).entries == 0


def test_refusal_states_the_product_its_factors_and_the_cap():
    ask = completion_ask(completion(**{**ECHO_ATTACK, "prompt": [1]}), 128, 1, True, 4000)
    with pytest.raises(APIError) as e:
        check_logprob_budget(ask)
    err = e.value
    assert err.status == 400 and err.param == "logprobs" and err.code == "too_many_logprobs"
    for part in ("10,752,000", "n 128", "4,000 tokens", "the prompt, echoed 4,000",
                 "21 per token", f"{CAP:,}"):
        assert part in err.message, (part, err.message)
    check_logprob_budget(ask, max_entries=ask.entries)  # at the cap: allowed


@pytest.fixture(scope="module")
def server():
    """Its own process (the watcher's reads cannot slow it); context for the 4,000-token
    prompt, room for 128 sequences beside the watcher's, and short prefill chunks so no
    engine step is long in itself."""
    with serve_process("--max-model-len", "4096", "--num-gpu-blocks", "1024",
                       "--max-num-seqs", "160", "--max-num-batched-tokens", "512") as s:
        yield s


def test_over_the_cap_is_a_fast_400(server):
    with httpx.Client(timeout=60) as client:
        for path, body in ((COMPLETIONS, ECHO_ATTACK), (CHAT, CHAT_ATTACK)):
            t0 = time.perf_counter()
            r = client.post(server.url + path, json=body)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 400, r.text[:300]
            err = r.json()["error"]
            assert err["code"] == "too_many_logprobs" and f"{CAP:,}" in err["message"]
            assert elapsed < 5, (path, elapsed)  # refused before any work (was minutes)
    assert "10,752,000" in client_error(server, ECHO_ATTACK)
    assert "1,344,000" in client_error(server, CHAT_ATTACK, CHAT)
    server.wait_idle()


def client_error(server, body: dict, path: str = COMPLETIONS) -> str:
    return httpx.post(server.url + path, json=body, timeout=60).json()["error"]["message"]


def test_just_under_the_cap_does_not_stall_other_streams(server):
    body = ChatCompletionRequest.model_validate(CHAT_UNDER, strict=True)
    assert chat_ask(body, "max_tokens", 93, 10).entries == 249_984 <= CAP
    watch = StreamWatch(server.url)
    bodies, events = [], []
    with watching(watch) as window, httpx.Client(timeout=300) as client:
        for _ in range(2):  # each twice: a stall they cause shows at least twice
            r = client.post(server.url + CHAT, json=CHAT_UNDER)
            assert r.status_code == 200, r.text[:300]
            bodies.append(r.content)  # parsed after the window: the watcher shares our GIL
            with client.stream("POST", server.url + CHAT,
                               json={**CHAT_UNDER, "stream": True}) as s:
                assert s.status_code == 200
                events.append([line for line in s.iter_lines() if line.startswith("data: {")])
    assert_no_stall(watch, window)

    for raw in bodies:
        choices = json.loads(raw)["choices"]
        assert len(choices) == 128
        for choice in choices:
            content = choice["logprobs"]["content"]
            assert len(content) == 93
            assert all(len(e["top_logprobs"]) == 20 for e in content)
    for lines in events:
        content: dict[int, list] = {}
        for line in lines:
            for ch in json.loads(line[6:])["choices"]:
                if ch["logprobs"]:
                    content.setdefault(ch["index"], []).extend(ch["logprobs"]["content"])
        assert sorted(content) == list(range(128))
        assert all(len(c) == 93 and len(c[-1]["top_logprobs"]) == 20
                   for c in content.values())
    server.wait_idle()
