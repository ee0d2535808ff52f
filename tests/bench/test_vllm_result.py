"""`--save-result`'s flat keys on a hand-built timeline: every key of vLLM's result,
against a hand computation with vLLM's definitions (vllm/benchmarks/serve.py)."""

from __future__ import annotations

import math

import pytest

from stepserve.bench.client import RequestRecord
from stepserve.bench.results import VllmSetup, parse_goodput, vllm_metrics, vllm_result


def _rec(i, send, chunks, *, out=None, prompt=None, prompt_len=0, reason="length",
         end=None, text="", error=None, status=200, warmup=False, scheduled=None):
    return RequestRecord(index=i, prompt_len=prompt_len, warmup=warmup, send_s=send,
                         scheduled_s=send if scheduled is None else scheduled,
                         end_s=end if end is not None else (chunks[-1] + 0.01 if chunks
                                                             else None),
                         chunk_times_s=list(chunks), output_tokens=out, prompt_tokens=prompt,
                         finish_reason=reason, status=status, error=error,
                         generated_text=text)


def timeline() -> list[RequestRecord]:
    """Four completed requests, one HTTP failure, a warm-up and one never sent."""
    return [
        _rec(0, 0.0, [5.0], out=1, prompt=99, warmup=True),  # warm-up: left out
        _rec(1, 0.0, [0.10, 0.15, 0.25, 0.30], out=4, prompt=10, text="abcd"),
        _rec(2, 0.5, [0.70, 0.90], out=2, prompt=20, reason="stop", text="xy",
             scheduled=0.3),  # waited 0.2 s in the client for a slot
        _rec(3, 1.0, [1.05], out=1, prompt=5, text="z"),
        _rec(4, 1.2, [], prompt_len=7, reason=None, end=1.3, status=500,
             error="HTTP 500: boom"),
        _rec(5, 2.0, [2.4, 2.6, 3.0], prompt_len=8, end=3.05, text="uvw"),  # no usage
        RequestRecord(index=6, prompt_len=3),  # cut off by --duration-s: never sent
    ]


def _stats(values):
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def test_every_flat_key_on_a_hand_built_timeline():
    setup = VllmSetup(backend="openai", model_id="org/m", tokenizer_id="org/m",
                      num_prompts=5, request_rate=math.inf, burstiness=1.0,
                      max_concurrency=4, metadata={"gpu": "h200"}, date="20250101-000000")
    metrics = vllm_metrics(timeline(), parse_goodput(["ttft:150", "tpot:70"]),
                           ("ttft", "tpot", "itl", "e2el"), (25.0, 50.0, 99.0, 99.9))
    got = vllm_result(setup, metrics, detailed=True)

    duration = 3.05  # first measured send (0.0) to the last end (request 5, 3.05)
    ttft = [0.10, 0.20, 0.05, 0.40]  # first chunk - send, completed only
    e2el = [0.30, 0.40, 0.05, 1.00]  # last chunk - send
    tpot = [(0.30 - 0.10) / 3, (0.40 - 0.20) / 1, (1.00 - 0.40) / 2]  # outputs over 1
    itl = [0.05, 0.10, 0.05, 0.20, 0.20, 0.40]
    # numpy's linear percentile of sorted values v at p: rank (n-1)p/100
    expected = {
        "date": "20250101-000000", "endpoint_type": "openai", "backend": "openai",
        "label": None, "model_id": "org/m", "tokenizer_id": "org/m", "num_prompts": 5,
        "gpu": "h200", "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 4,
        "duration": duration, "completed": 4, "failed": 1,
        "total_input_tokens": 10 + 20 + 5 + 8,  # usage counts; request 5 has none
        "total_output_tokens": 4 + 2 + 1 + 3,  # request 5: one token per chunk
        "request_throughput": 4 / duration,
        "request_goodput": 2 / duration,  # requests 1 and 3 meet TTFT 150 and TPOT 70 ms
        "output_throughput": 10 / duration, "total_token_throughput": 53 / duration,
        "input_lens": [10, 20, 5, 7, 8], "output_lens": [4, 2, 1, 0, 3],
        "ttfts": [0.10, 0.20, 0.05, 0.0, 0.40],
        "itls": [[0.05, 0.10, 0.05], [0.20], [], [], [0.20, 0.40]],
        "latencies": [0.30, 0.40, 0.05, 0.0, 1.00],  # e2el, 0 for the failed one
        "start_times": [0.0, 0.5, 1.0, 1.2, 2.0],
        "queue_times": [0.0, 0.2, 0.0, 0.0, 0.0],
        "generated_texts": ["abcd", "xy", "z", "", "uvw"],
        "errors": ["", "", "", "HTTP 500: boom", ""],
        # one-second buckets from t=0: chunks 6,1,2,1; active requests 2,1,1,1
        "max_output_tokens_per_s": 6.0, "max_concurrent_requests": 2, "rtfx": 0.0,
    }
    hand = {"ttft": (ttft, {25: 0.05 + 0.75 * 0.05, 50: 0.15, 99: 0.2 + 0.97 * 0.2,
                            99.9: 0.2 + 0.997 * 0.2}),
            "tpot": (tpot, {25: 1 / 15 + 0.5 * (0.2 - 1 / 15), 50: 0.2,
                            99: 0.2 + 0.98 * 0.1, 99.9: 0.2 + 0.998 * 0.1}),
            "itl": (itl, {25: 0.05 + 0.25 * 0.05, 50: 0.15, 99: 0.2 + 0.95 * 0.2,
                          99.9: 0.2 + 0.995 * 0.2}),
            "e2el": (e2el, {25: 0.05 + 0.75 * 0.25, 50: 0.35, 99: 0.4 + 0.97 * 0.6,
                            99.9: 0.4 + 0.997 * 0.6})}
    for name, (values, pcts) in hand.items():
        m, std = _stats(values)
        expected[f"mean_{name}_ms"] = m * 1000
        expected[f"median_{name}_ms"] = pcts[50] * 1000
        expected[f"std_{name}_ms"] = std * 1000
        for p, word in ((25, "25"), (50, "50"), (99, "99"), (99.9, "99.9")):
            expected[f"p{word}_{name}_ms"] = pcts[p] * 1000

    assert list(got) == list(expected)  # vLLM's keys, in vLLM's order
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        elif key == "itls":
            assert [pytest.approx(v) for v in got[key]] == value
        elif key in ("ttfts", "latencies", "start_times", "queue_times"):
            assert got[key] == pytest.approx(value)
        else:
            assert got[key] == value, key
    assert setup.filename() == "openai-infqps-concurrency4-m-20250101-000000.json"


def test_defaults_without_detail_or_goodput_and_an_all_failed_run():
    setup = VllmSetup(backend="openai-chat", model_id="m", tokenizer_id="m", num_prompts=1,
                      request_rate=4.0, burstiness=0.5, max_concurrency=None, label="L")
    got = vllm_result(setup, vllm_metrics(timeline()))
    assert got["request_goodput"] is None and got["request_rate"] == 4.0
    assert not {"input_lens", "ttfts", "itls", "errors", "start_times"} & set(got)
    assert {"latencies", "queue_times", "rtfx"} <= set(got)  # kept, as vLLM keeps them
    # vLLM's default metrics and percentile: ttft, tpot, itl at P99 (no e2el)
    assert [k for k in got if k.endswith("_ms")] == [
        f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl")
        for s in ("mean", "median", "std", "p99")]
    assert setup.filename().startswith("L-4.0qps-m-")
    failed = vllm_metrics([_rec(0, 0.0, [], reason=None, end=0.5, status=500,
                                error="HTTP 500: boom")])
    assert failed["completed"] == 0 and failed["failed"] == 1
    assert failed["mean_ttft_ms"] == failed["p99_itl_ms"] == 0.0  # numpy's mean of [0]
    assert failed["max_output_tokens_per_s"] == 0.0 and failed["request_throughput"] == 0.0
