"""/metrics as vLLM means it: TTFT and inter-token gaps observed as tokens come out (an
aborted stream's too), the `engine` label, the per-request inference time and token
histograms, and the process metrics."""

import httpx
from server_harness import MODEL

PROMPT = list(range(10, 42))  # 32 token ids


def counts(served) -> dict[str, float]:
    m = served.metrics()
    names = ("time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
             "generation_tokens_total", "e2e_request_latency_seconds_count",
             "request_inference_time_seconds_count", "request_prompt_tokens_count",
             "request_prompt_tokens_sum", "request_generation_tokens_count",
             "request_generation_tokens_sum")
    out = {n: m.get("stepserve:" + n, 0.0) for n in names}
    out["abort"] = served.metric("stepserve:request_success_total", finished_reason="abort")
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def test_an_aborted_stream_contributes_its_ttft_and_itl(served):
    served.wait_idle()
    before = counts(served)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "stream": True,
            "ignore_eos": True, "temperature": 0.0}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", served.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            chunks = [line for _, line in zip(range(12), r.iter_lines())
                      if line.startswith("data: {")]
            assert len(chunks) >= 5
        # leaving the block closes the connection mid-stream: the server aborts it
    served.wait_idle(timeout=10)
    d = delta(counts(served), before)
    assert d["abort"] == 1
    generated = d["generation_tokens_total"]
    assert 5 <= generated < 200
    assert d["time_to_first_token_seconds_count"] == 1
    assert d["inter_token_latency_seconds_count"] == generated - 1  # one gap per later token
    # the per-request histograms take completed requests only, as before
    assert d["e2e_request_latency_seconds_count"] == 0
    assert d["request_inference_time_seconds_count"] == 0


def test_a_completed_request_feeds_the_per_request_histograms(served):
    served.wait_idle()
    before = counts(served)
    out = served.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=7,
                                             temperature=0.0,
                                             extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 7
    served.wait_idle()
    d = delta(counts(served), before)
    assert d["time_to_first_token_seconds_count"] == 1
    assert d["inter_token_latency_seconds_count"] == 6
    assert d["request_inference_time_seconds_count"] == 1
    assert (d["request_prompt_tokens_count"], d["request_prompt_tokens_sum"]) == (1, 32)
    assert (d["request_generation_tokens_count"], d["request_generation_tokens_sum"]) == (1, 7)


def test_engine_label_and_process_metrics(served):
    text = httpx.get(served.url + "/metrics").text
    from stepserve.metrics.prometheus import parse_prometheus

    samples = parse_prometheus(text)
    ours = [dict(ls) for (n, ls) in samples if n.startswith("stepserve:")]
    assert ours and all(ls.get("engine") == "0" and ls.get("model_name") == MODEL
                        for ls in ours)
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_open_fds", "python_info"):
        assert any(n == name for n, _ in samples), name
