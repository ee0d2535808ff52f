"""`stepserve bench` against our own server on 127.0.0.1 (tiny model): the metric set,
and counts that agree with the server's own /metrics; the same workload via --sim."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main
from stepserve.config.settings import EngineConfig

METRIC_KEYS = {
    "requests_total", "requests_finished", "requests_failed", "output_tokens",
    "throughput_tokens_per_s", "throughput_requests_per_s", "goodput_requests_per_s",
    "peak_concurrency", "waiting_max", "running_max", "kv_usage_max", "preemptions",
    "server_requests_finished", "server_generation_tokens",
    *(f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e")
      for s in ("mean", "p50", "p95", "p99")),
}
WORKLOAD = ["--random-input-len", "16", "--random-output-len", "8", "--no-progress",
            "--goodput", "ttft:5000", "tpot:2000", "--metrics-interval-s", "0.2"]


def _bench(tmp_path, name: str, *argv: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["bench", *argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"schema_version", "runs", "findings"}
    return result["runs"][0]["summary"]


@pytest.mark.parametrize("arrivals", [["--request-rate", "20", "--num-prompts", "12"],
                                      ["--max-concurrency", "4", "--num-prompts", "12"]],
                         ids=["poisson", "closed-loop"])
def test_bench_against_our_server(served, tmp_path, arrivals):
    served.wait_idle()
    before = served.metrics()
    s = _bench(tmp_path, "run", "--target", served.url, *WORKLOAD, *arrivals,
               "--csv", str(tmp_path / "r.csv"), "--markdown", str(tmp_path / "r.md"))
    after = served.metrics()
    assert METRIC_KEYS <= set(s)
    assert s["requests_total"] == s["requests_finished"] == 12
    assert s["requests_failed"] == 0 and s["output_tokens"] == 12 * 8
    assert s["ttft_p50_s"] > 0 and s["tpot_p50_s"] > 0 and s["itl_p99_s"] > 0
    assert s["goodput_requests_per_s"] is not None
    assert 1 <= s["peak_concurrency"] <= 12
    if "--max-concurrency" in arrivals:
        assert s["peak_concurrency"] <= 4
    finished = after["stepserve:request_success_total"] - \
        before["stepserve:request_success_total"]
    generated = after["stepserve:generation_tokens_total"] - \
        before["stepserve:generation_tokens_total"]
    assert finished == s["requests_finished"] == s["server_requests_finished"]
    assert generated == s["output_tokens"] == s["server_generation_tokens"]
    assert s["metrics_source"] == "stepserve" and s["scrape_samples"] >= 2
    assert s["running_max"] is not None and s["kv_usage_max"] is not None
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert len(rows) == 13 and rows[0].startswith("index,")
    assert "| ttft ms mean/p50/p95/p99 |" in (tmp_path / "r.md").read_text()


def test_sim_reports_the_same_metric_set(tmp_path):
    s = _bench(tmp_path, "sim", "--sim", "--cost", "constant", *WORKLOAD,
               "--request-rate", "20", "--num-prompts", "12")
    assert METRIC_KEYS <= set(s)
    assert s["requests_finished"] == s["server_requests_finished"] == 12
    assert s["output_tokens"] == s["server_generation_tokens"] == 96
    assert s["tpot_p50_s"] == pytest.approx(0.025)  # the constant 25 ms step


def test_warmup_is_excluded(served, tmp_path):
    s = _bench(tmp_path, "w", "--target", served.url, *WORKLOAD, "--max-concurrency", "2",
               "--num-prompts", "6", "--warmup", "2")
    assert s["requests_total"] == 4 and s["warmup_requests"] == 2
    assert s["server_requests_finished"] == 6  # the server saw the warm-up too


def test_engine_reports_the_same_metric_set(tmp_path):
    s = _bench(tmp_path, "engine", "--engine", "--model", "tiny", "--num-gpu-blocks", "128",
               "--max-model-len", "256", *WORKLOAD, "--max-concurrency", "3",
               "--num-prompts", "6")
    assert METRIC_KEYS <= set(s)
    assert s["requests_finished"] == s["server_requests_finished"] == 6
    assert s["output_tokens"] == 48 and s["peak_concurrency"] <= 3
    # on a CPU the engine's own step budget, as `stepserve serve` gets it, unless given
    sched = json.loads((tmp_path / "engine.json").read_text())["runs"][0]["config"][
        "scheduler"]
    assert sched["max_num_batched_tokens"] < EngineConfig().scheduler.max_num_batched_tokens
    assert sched["long_prefill_token_threshold"] > 0
    _bench(tmp_path, "given", "--engine", "--model", "tiny", "--num-gpu-blocks", "128",
           "--max-model-len", "256", "--max-num-batched-tokens", "96", *WORKLOAD,
           "--num-prompts", "2")
    sched = json.loads((tmp_path / "given.json").read_text())["runs"][0]["config"][
        "scheduler"]
    assert sched["max_num_batched_tokens"] == 96


def test_chat_and_exact_length_text_on_our_server(served, tmp_path):
    served.wait_idle()
    small = ["--random-input-len", "16", "--random-output-len", "8", "--num-prompts", "6",
             "--no-progress", "--metrics-interval-s", "0.2"]
    s = _bench(tmp_path, "chat", "--base-url", served.url, "--backend", "openai-chat",
               *small, "--max-concurrency", "3", "--save-result", "--save-detailed",
               "--result-dir", str(tmp_path), "--result-filename", "v.json")
    saved = json.loads((tmp_path / "v.json").read_text())
    assert s["requests_finished"] == saved["completed"] == 6 and saved["failed"] == 0
    assert saved["total_output_tokens"] == s["output_tokens"] == 48
    assert saved["backend"] == "openai-chat" and all(saved["generated_texts"])
    # text that the model's tokenizer encodes to exactly 16 tokens: the server counts 96
    s = _bench(tmp_path, "text", "--target", served.url, *small, "--tokenizer", "tiny")
    assert s["prompt_tokens"] == s["server_prompt_tokens"] == 6 * 16
