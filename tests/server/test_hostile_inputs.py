"""Hostile inputs: each gets its 4xx in OpenAI's error shape within a second, the server
stays healthy and holds no block afterwards, and a stream running meanwhile is not held
up by more than about one engine step (nothing heavy runs on the event loop)."""

from __future__ import annotations

import gc
import json
import statistics
import threading
import time

import httpx
import pytest
from server_harness import MODEL, serve_process

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
]


@pytest.fixture(scope="module")
def server():
    """Its own process: the client's work in this process cannot delay its streams."""
    with serve_process() as s:
        yield s


def test_at_least_forty_hostile_inputs():
    assert len(CASES) >= 40


class StreamWatch:
    """Streams back to back on a thread and records the gaps between chunks of a
    stream (inter-token latencies), with when each gap ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.gaps: list[tuple[float, float]] = []  # (end time, gap)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200,
                "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                with client.stream("POST", self.url + COMPLETIONS, json=body) as r:
                    last = None
                    for line in r.iter_lines():
                        now = time.perf_counter()
                        if not line.startswith("data: {"):
                            continue
                        if last is not None:
                            self.gaps.append((now, now - last))
                        last = now

    def gaps_between(self, t0: float, t1: float) -> list[float]:
        return [g for end, g in self.gaps if t0 <= end <= t1]


def test_hostile_inputs_answered_fast_without_stalling_a_stream(server):
    # The watcher reads the stream in this process: a garbage collection of the test
    # session's heap would pause it and read as a server stall, so none runs meanwhile.
    gc.collect()
    gc.disable()
    try:
        _check_hostile_inputs_fast(server)
    finally:
        gc.enable()


def _check_hostile_inputs_fast(server) -> None:
    watch = StreamWatch(server.url)
    watch.thread.start()
    time.sleep(1.0)  # a baseline of ordinary gaps
    t_start = time.perf_counter()
    slow = []
    with httpx.Client(timeout=30) as client:
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
    t_end = time.perf_counter()
    time.sleep(0.5)
    watch.stop.set()
    watch.thread.join(60)
    assert not slow, f"answered in over 1 s: {slow}"

    before = [g for end, g in watch.gaps if end < t_start]
    during = watch.gaps_between(t_start, t_end)
    assert len(before) > 20 and len(during) > 10
    step = statistics.median(before)
    # "One step's worth" of delay at most, with room for a noisy 2-core machine: the worst
    # gap while hostile requests were parsed is within the worst ordinary gap plus one step
    # and a scheduling allowance.
    # Every case is sent twice, so a stall one of them causes shows up at least twice;
    # a lone longer gap is the shared machine (a neighbour taking the core for ~0.1 s,
    # seen in CI), so the second-worst gap is held to the allowance and the worst to 0.5 s.
    allowance = max(before) + step + 0.1
    worst, second = sorted(during)[-1], sorted(during)[-2]
    assert second <= allowance, (second, max(before), step)
    assert worst <= 0.5, (worst, max(before), step)

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
