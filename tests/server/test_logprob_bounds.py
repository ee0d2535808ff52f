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

# measures inter-token gaps: runs alone, after the parallel part of the suite
pytestmark = pytest.mark.serial

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
CAP = DEFAULT_MAX_LOGPROB_ENTRIES
ECHO_ATTACK = {"model": MODEL, "prompt": [5] * 4000, "max_tokens": 0, "echo": True,
               "logprobs": 20, "n": 128}
CHAT_ATTACK = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 64,
               "logprobs": True, "top_logprobs": 20, "max_tokens": 1000}
# just under the cap: 128 sequences echoing a 93-token prompt with vLLM's prompt_logprobs
# of 20 alternatives (249,984 entries, ~17 MB of JSON at once or on the choices' first
# chunks): cheap prefill for the engine (the tiny model, short chunks), a big render for
# whoever renders it (on the event loop: seconds)
ECHO_UNDER = {"model": MODEL, "prompt": [5, 6, 7] * 31, "max_tokens": 0, "echo": True,
              "prompt_logprobs": 20, "n": 128}

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
                       "--max-num-seqs", "160", "--max-num-batched-tokens", "128") as s:
        yield s


def test_over_the_cap_is_refused_before_any_work(server):
    steps = httpx.get(server.url + "/health").json()["steps"]
    refused = server.metric("stepserve:request_rejected_total", reason="invalid")
    for path, body, product in ((COMPLETIONS, ECHO_ATTACK, "10,752,000"),
                                (CHAT, CHAT_ATTACK, "1,344,000")):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "too_many_logprobs" and f"{CAP:,}" in err["message"]
        assert product in err["message"]
    assert httpx.get(server.url + "/health").json()["steps"] == steps  # the engine idle
    assert server.metric("stepserve:request_rejected_total", reason="invalid") == refused + 2


@pytest.mark.timing
def test_over_the_cap_is_a_fast_400(server):
    """The 4,000-token echo with n = 128 took 421 s before the budget."""
    with httpx.Client(timeout=60) as client:
        for path, body in ((COMPLETIONS, ECHO_ATTACK), (CHAT, CHAT_ATTACK)):
            t0 = time.perf_counter()
            r = client.post(server.url + path, json=body)
            assert r.status_code == 400, r.text[:300]
            assert time.perf_counter() - t0 < 10, path


@pytest.mark.timing  # the inter-token gaps' bound is the point
def test_just_under_the_cap_does_not_stall_other_streams(server):
    ask = completion_ask(completion(**ECHO_UNDER), 128, 1, True, 93)
    assert ask.entries == 249_984 <= CAP
    watch = StreamWatch(server.url)
    bodies, events = [], []
    with watching(watch) as window, httpx.Client(timeout=300) as client:
        for _ in range(2):  # each twice: a stall they cause shows at least twice
            r = client.post(server.url + COMPLETIONS, json=ECHO_UNDER)
            assert r.status_code == 200, r.text[:300]
            bodies.append(r.content)  # parsed after the window: the watcher shares our GIL
            with client.stream("POST", server.url + COMPLETIONS,
                               json={**ECHO_UNDER, "stream": True}) as s:
                assert s.status_code == 200
                events.append([line for line in s.iter_lines() if line.startswith("data: {")])
    # the engine's prefill steps for these requests build 20 alternatives for up to 128
    # prompt positions each (~0.05-0.1 s of their own); rendered on the event loop or
    # unpaced, the answers held others' gaps at 0.46-0.86 s
    assert_no_stall(watch, window, own_steps_s=0.1)

    for raw in bodies:
        choices = json.loads(raw)["choices"]
        assert len(choices) == 128
        assert all(_whole(c["prompt_logprobs"]) for c in choices)
    for lines in events:
        found = [ch["prompt_logprobs"] for line in lines
                 for ch in json.loads(line[6:])["choices"] if ch["prompt_logprobs"]]
        assert len(found) == 128 and all(_whole(p) for p in found)
    server.wait_idle()


def _whole(prompt_logprobs: list) -> bool:
    """93 positions, the first None, each other the prompt token and 20 alternatives (the
    token itself among them or not)."""
    return (len(prompt_logprobs) == 93 and prompt_logprobs[0] is None
            and all(len(p) in (20, 21) for p in prompt_logprobs[1:]))
