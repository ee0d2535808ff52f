"""`stepserve doctor` and `stepserve report` read a `vllm bench serve --save-result` file
(recognised by its keys), and a file our bench wrote with --save-result."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main
from stepserve.metrics.rules import unevaluable
from stepserve.metrics.vllm_summary import is_vllm_result, vllm_summary

# As `vllm bench serve --dataset-name random --save-result --save-detailed --goodput
# ttft:200 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99` writes
# it: three completed requests (TTFT 0.1/0.3/0.2 s, gaps [.02 .03 .05]/[.04]/[], outputs
# 4/2/1) and one failed, over 2 s. The ms values are worked out by hand from those.
VLLM_RESULT = {
    "date": "20250601-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 4,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2,
    "duration": 2.0, "completed": 3, "failed": 1, "total_input_tokens": 350,
    "total_output_tokens": 7, "request_throughput": 1.5, "request_goodput": 1.0,
    "output_throughput": 3.5, "total_token_throughput": 178.5,
    "input_lens": [100, 200, 50, 80], "output_lens": [4, 2, 1, 0],
    "ttfts": [0.1, 0.3, 0.2, 0.0], "itls": [[0.02, 0.03, 0.05], [0.04], [], []],
    "generated_texts": ["a b c d", "e f", "g", ""],
    "errors": ["", "", "", "Traceback (most recent call last): ClientConnectorError"],
    "max_output_tokens_per_s": 7.0, "max_concurrent_requests": 2,
    "mean_ttft_ms": 200.0, "median_ttft_ms": 200.0, "std_ttft_ms": 81.64965809277261,
    "p50_ttft_ms": 200.0, "p90_ttft_ms": 280.0, "p99_ttft_ms": 298.0,
    "mean_tpot_ms": 36.666666666666664, "median_tpot_ms": 36.666666666666664,
    "std_tpot_ms": 3.3333333333333335, "p50_tpot_ms": 36.666666666666664,
    "p90_tpot_ms": 39.333333333333336, "p99_tpot_ms": 39.93333333333333,
    "mean_itl_ms": 35.0, "median_itl_ms": 35.0, "std_itl_ms": 11.180339887498949,
    "p50_itl_ms": 35.0, "p90_itl_ms": 47.0, "p99_itl_ms": 49.7,
    "mean_e2el_ms": 246.66666666666666, "median_e2el_ms": 200.0,
    "std_e2el_ms": 65.99663291074443, "p50_e2el_ms": 200.0, "p90_e2el_ms": 312.0,
    "p99_e2el_ms": 337.2,
}


@pytest.fixture
def vllm_file(tmp_path):
    path = tmp_path / "vllm-infqps-concurrency2-Llama-3.1-8B-Instruct-20250601-120000.json"
    path.write_text(json.dumps(VLLM_RESULT))
    return path


def test_a_vllm_result_becomes_a_run_summary_in_seconds():
    assert is_vllm_result(VLLM_RESULT) and not is_vllm_result({"runs": [], **VLLM_RESULT})
    s = vllm_summary(VLLM_RESULT)
    assert (s.requests_total, s.requests_finished, s.requests_failed) == (4, 3, 1)
    assert (s.prompt_tokens, s.output_tokens, s.duration_s) == (350, 7, 2.0)
    assert s.throughput_requests_per_s == 1.5 and s.throughput_tokens_per_s == 3.5
    assert s.goodput_requests_per_s == 1.0 and s.goodput_requests == 2
    assert s.ttft_mean_s == pytest.approx(0.2) and s.ttft_p50_s == pytest.approx(0.2)
    assert s.ttft_p99_s == pytest.approx(0.298) and s.e2e_p99_s == pytest.approx(0.3372)
    assert s.tpot_p50_s == pytest.approx(0.11 / 3) and s.itl_p99_s == pytest.approx(0.0497)
    # P95 is not in the file: from the per-request lists (E2EL = TTFT + its gaps)
    assert s.ttft_p95_s == pytest.approx(0.2 + 0.9 * 0.1)
    assert s.e2e_p95_s == pytest.approx(0.2 + 0.9 * 0.14)
    assert s.tpot_p95_s == pytest.approx(0.1 / 3 + 0.95 * (0.04 - 0.1 / 3))
    assert s.itl_max_s == pytest.approx(0.05)
    assert s.p99_p50_ttft_ratio == pytest.approx(0.298 / 0.2)
    assert s.preemptions is None and s.waiting_max is None  # the client's view only


def test_without_detail_or_completions():
    flat = {k: v for k, v in VLLM_RESULT.items()
            if k not in ("input_lens", "output_lens", "ttfts", "itls", "errors")}
    s = vllm_summary(flat)
    assert s.ttft_p99_s == pytest.approx(0.298) and s.ttft_p95_s is None
    none_done = {**flat, "completed": 0, "failed": 4, "mean_ttft_ms": 0.0}
    assert vllm_summary(none_done).ttft_mean_s is None  # vLLM's 0.0 is no latency


def test_doctor_reads_a_vllm_result_and_names_what_cannot_run(vllm_file, capsys):
    assert main(["doctor", str(vllm_file)]) == 0
    out = capsys.readouterr().out
    missing = unevaluable(vllm_summary(VLLM_RESULT))
    assert "capacity" in missing and "preemption_nonzero" in missing
    assert out.startswith("run vllm:")
    lines = [line for line in out.splitlines() if "cannot run without server-side" in line]
    assert len(lines) == 1 and f"{len(missing)} rule(s)" in lines[0]
    assert all(rule in lines[0] for rule in missing)
    assert main(["doctor", str(vllm_file), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["not_evaluable"] == missing


def test_report_reads_a_vllm_result(vllm_file, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(vllm_file), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "vllm" in page and (out / "cdf_ttft.png").exists()  # from the ttfts list


def test_not_quite_a_vllm_result_is_refused(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"completed": 3, "request_throughput": 1.0}))  # no duration
    assert main(["doctor", str(path)]) == 2
    assert "neither a result file" in capsys.readouterr().err
    assert main(["report", str(path), "--out", str(tmp_path / "r")]) == 2
    assert "no vLLM result keys" in capsys.readouterr().err


def test_our_save_result_round_trips_through_doctor_and_report(tmp_path, capsys):
    ours = tmp_path / "ours.json"
    assert main(["bench", "--sim", "--cost", "constant", "--random-input-len", "16",
                 "--random-output-len", "8", "--num-prompts", "12", "--max-concurrency",
                 "4", "--seed", "3", "--no-progress", "--json", str(ours), "--save-result",
                 "--save-detailed", "--result-dir", str(tmp_path / "res"),
                 "--result-filename", "r.json", "--label", "mine", "--metadata", "gpu=none",
                 "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
                 "50,99"]) == 0
    saved = json.loads((tmp_path / "res" / "r.json").read_text())
    s = json.loads(ours.read_text())["runs"][0]["summary"]
    assert saved["label"] == "mine" and saved["gpu"] == "none"
    assert saved["request_rate"] == "inf" and saved["max_concurrency"] == 4
    assert saved["num_prompts"] == 12 and saved["completed"] == s["requests_finished"] == 12
    assert saved["total_output_tokens"] == s["output_tokens"] == 96
    assert saved["p99_e2el_ms"] == pytest.approx(s["e2e_p99_s"] * 1000)
    assert saved["median_tpot_ms"] == pytest.approx(s["tpot_p50_s"] * 1000)
    assert len(saved["ttfts"]) == 12
    capsys.readouterr()
    assert main(["doctor", str(tmp_path / "res" / "r.json")]) == 0
    assert "run mine:" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "res" / "r.json"), "--out",
                 str(tmp_path / "rep")]) == 0
