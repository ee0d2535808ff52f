"""`stepserve bench` as `vllm bench serve`: its defaults, its flags, and what goes on the
wire (bodies and headers, seen by a fake server)."""

from __future__ import annotations

import argparse
import json
import random

import pytest
from fake_server import run_fake

from stepserve.bench.client import RequestShape
from stepserve.bench.prompt_maker import exact_text
from stepserve.bench.workload_options import build_workload, make_specs
from stepserve.cli import main
from stepserve.cli.bench import add_bench_parser, bench_options
from stepserve.workload.arrivals import Gamma

SMALL = ["--random-input-len", "4", "--random-output-len", "3", "--no-progress"]


def _options(*argv: str):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return bench_options(parser.parse_args(["bench", *argv]))


def _specs(*argv: str):
    w = _options("--sim", *argv).workload
    workload = build_workload(w)
    return workload, make_specs(w, workload)


def test_vllm_defaults():
    options = _options()  # no target, no workload, no rate: as `vllm bench serve`
    assert options.target == "http://127.0.0.1:8000" and options.shape.endpoint == \
        "/v1/completions" and options.shape.sampling == {}  # vLLM 0.32: the server's
    # workload files and scenarios stay greedy unless told otherwise
    assert _options("--scenario", "quickstart").shape.sampling == {"temperature": 0.0}
    assert not options.token_id_prompts and options.save.percentile_metrics == \
        ("ttft", "tpot", "itl") and options.save.metric_percentiles == (99.0,)
    workload, specs = _specs()
    assert len(specs) == 1000 and {s.arrival_s for s in specs} == {0.0}  # all at once
    assert {(s.prompt_len, s.output_len) for s in specs} == {(1024, 128)}
    assert _options("--base-url", "http://h:1").target == "http://h:1"
    assert _options("--host", "h", "--port", "9").target == "http://h:9"


def test_random_range_ratio_and_rate_normalised_as_vllm():
    _, specs = _specs("--random-input-len", "10", "--random-output-len", "4",
                      "--random-range-ratio", "0.5", "--num-prompts", "200")
    assert {s.prompt_len for s in specs} == set(range(5, 16))  # [floor 5, ceil 15]
    assert {s.output_len for s in specs} == set(range(2, 7))
    workload, specs = _specs("--input-len", "8", "--output-len", "4", "--num-prompts", "50",
                             "--request-rate", "10", "--burstiness", "0.5", "--seed", "3")
    assert isinstance(workload.arrival, Gamma) and specs[0].prompt_len == 8
    assert specs[-1].arrival_s == pytest.approx(4.9)  # 49 gaps of mean exactly 1/rate


@pytest.mark.parametrize("flags, peak", [([], 8), (["--request-rate", "inf",
                                                    "--max-concurrency", "2"], 2),
                                         (["--request-rate", "200", "--max-concurrency",
                                           "2"], 2)],
                         ids=["default-all-at-once", "inf-capped", "rate-capped"])
def test_rate_and_concurrency_cap_on_a_server(tmp_path, flags, peak):
    out = tmp_path / "r.json"
    with run_fake(delay_s=0.02) as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "8", *flags,
                     "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["summary"]["requests_finished"] == 8
    assert run["summary"]["peak_concurrency"] == peak
    load = run["load"]
    assert load["max_concurrency"] == (2 if flags else None) and load["num_prompts"] == 8
    assert load["request_rate"] == ("inf" if "200" not in flags else 200.0)


def test_bodies_and_headers_as_vllm_sends_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "k1")
    with run_fake(api_key="k1") as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "2",
                     "--header", "X-Trace=abc", "--temperature", "0.7", "--top-p", "0.9",
                     "--top-k", "5", "--min-p", "0.1", "--repetition-penalty", "1.1",
                     "--extra-body", '{"min_tokens": 2}']) == 0
        path, headers, body = fake.settings["seen"][-1]
        assert path == "/v1/completions" and headers["authorization"] == "Bearer k1"
        assert headers["x-trace"] == "abc"
        assert isinstance(body["prompt"], str) and len(body["prompt"].split()) == 4
        assert body["max_tokens"] == 3 and body["ignore_eos"] is True  # random lengths
        assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p",
                                     "repetition_penalty", "min_tokens")} == \
            {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
             "repetition_penalty": 1.1, "min_tokens": 2}
        monkeypatch.delenv("OPENAI_API_KEY")
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "2",
                     "--backend", "openai-chat", "--api-key", "k1"]) == 0
        path, headers, body = fake.settings["seen"][-1]
        assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer k1"
        assert body["messages"][0]["role"] == "user" and "prompt" not in body
        assert body["max_completion_tokens"] == 3 and "temperature" not in body
        note = capsys.readouterr().err  # what vLLM's defaults leave to the server, said
        assert "no temperature is sent" in note and "--temperature 0 --ignore-eos" in note
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "2",
                     "--token-id-prompts", "--header", "Authorization=Bearer k1"]) == 0
        assert all(isinstance(t, int) for t in fake.settings["seen"][-1][2]["prompt"])
        capsys.readouterr()
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "2"]) == 2
        assert "HTTP 401: pass its key (OPENAI_API_KEY" in capsys.readouterr().err


def test_sharegpt_runs_stop_at_eos_unless_asked(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": "q" * 40},
                                {"from": "gpt", "value": "a" * 24}]}]
    data = tmp_path / "sg.json"
    data.write_text(json.dumps(convs))
    with run_fake() as fake:
        for extra, expected in (([], None), (["--ignore-eos"], True)):
            assert main(["bench", "--target", fake.url, "--dataset-name", "sharegpt",
                         "--dataset-path", str(data), "--num-prompts", "2", "--no-progress",
                         *extra]) == 0
            assert fake.settings["seen"][-1][2].get("ignore_eos") is expected
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "1",
                     "--no-ignore-eos"]) == 0
        assert "ignore_eos" not in fake.settings["seen"][-1][2]


@pytest.mark.parametrize("flags, says", [
    (["--header", "novalue"], "--header 'novalue': expected KEY=VALUE"),
    (["--percentile-metrics", "ttft,p99"], "--percentile-metrics 'p99': allowed: ttft"),
    (["--metric-percentiles", "99,x"], "--metric-percentiles '99,x': expected numbers"),
    (["--endpoint", "/v1/chat/completions", "--token-id-prompts"], "takes text only"),
    (["--backend", "openai-chat", "--endpoint", "/v1/completions"], "sends to"),
    (["--extra-body", "[1]"], "--extra-body: expected a JSON object"),
    (["--random-range-ratio", "1"], "--random-range-ratio = 1: must be"),
    (["--dataset-name", "sharegpt"], "needs --dataset-path FILE"),
])
def test_bad_vllm_flags_are_one_line(flags, says, capsys):
    assert main(["bench", "--sim", *SMALL, "--num-prompts", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_body_shapes():
    shape = RequestShape(sampling={"temperature": 0.0, "min_p": 0.05},
                         extra_body={"temperature": 1.0}, served_model_name="served")
    body = shape.body("m", "hi", 5, ignore_eos=False)
    assert body["model"] == "served" and body["temperature"] == 1.0  # extra_body last
    assert body["min_p"] == 0.05 and "ignore_eos" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_exact_length_text_with_a_tokenizer():
    pytest.importorskip("tokenizers")
    from stepserve.bench.prompt_maker import load_tokenizer

    tok = load_tokenizer("tiny")
    rng = random.Random(0)
    for n in (1, 7, 64, 300):
        assert len(tok.encode(exact_text(tok, n, rng), add_special_tokens=False)) == n


def test_num_warmups_come_on_top_and_logprobs_go_in_the_body(capsys):
    w = _options("--num-warmups", "3", "--num-prompts", "5").workload
    assert (w.num_prompts, w.warmup) == (8, 3)  # 5 measured, as vLLM counts them
    assert _options("--logprobs", "2").shape.body("m", "p", 4, False)["logprobs"] == 2
    assert main(["bench", "--sim", *SMALL, "--warmup", "1", "--num-warmups", "2"]) == 2
    assert "not both" in capsys.readouterr().err
