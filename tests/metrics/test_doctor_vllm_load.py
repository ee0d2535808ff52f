"""`stepserve doctor --url` on real vLLM 0.32.0 scrapes taken under load (tests/fixtures/
vllm-0.32.0/README.md: 32 clients in flight on `--max-num-seqs 4`), replayed in order by
a local HTTP server, each stamped with the time it was captured at: every rule vLLM's
series can feed is evaluated, and the text and --json report say the same."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from metrics.test_doctor_url import metrics_server

from stepserve.cli import main
from stepserve.metrics import bounded_scrape

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0"
# (file, seconds since the first scrape): the capture scraped every 5 s
CAPTURED = (("metrics_before_load.txt", 0.0), ("metrics_load_3.txt", 15.0),
            ("metrics_load_6.txt", 30.0), ("metrics_load_9.txt", 45.0),
            ("metrics_after_load.txt", 60.0))
FIVE_SCRAPES = ("--window-s", "0.04", "--interval-s", "0.01")
# the rules no vLLM series can feed, and why: no step kinds, step times or slots, no
# prompts (the prefix cache's repeated share), no queue timeout, no SLO
NOT_FROM_VLLM = {
    "chunk_cap_eats_budget": ["prefill_step_share or zero_decode_step_share"],
    "tail_ttft_from_prefill": ["mean_step_s"],
    "low_slot_utilization": ["slot_utilization"],
    "low_active_ratio": ["active_ratio_p50 or slot_utilization or active_ratio_mean"],
    "prefix_cache_thrash": ["prefix_cache_hit_rate", "prefix_repeated_share"],
    "timeouts": ["requests_timed_out"],
    "throughput_over_experience": ["goodput_requests_per_s or mean_step_s",
                                   "goodput_requests_per_s or slot_utilization"],
}


class CaptureClock:
    """Stamps the i-th scrape with the time its text was captured at (metrics_server
    sets `gets`), so the window is the capture's 60 s, not the replay's few ms."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gets = 0
        times = [t for _, t in CAPTURED]
        monkeypatch.setattr(bounded_scrape, "time", SimpleNamespace(
            monotonic=lambda: times[min(self.gets, len(times)) - 1]))


@pytest.fixture
def clock(monkeypatch) -> CaptureClock:
    return CaptureClock(monkeypatch)


def captured_texts() -> list[str]:
    return [(FIXTURES / name).read_text() for name, _ in CAPTURED]


def doctor(capsys, clock: CaptureClock, *argv: str, texts: list[str] | None = None
           ) -> tuple[int, str, str]:
    with metrics_server(texts or captured_texts(), clock=clock) as url:
        code = main(["doctor", "--url", url, *FIVE_SCRAPES, *argv])
    assert clock.gets == len(CAPTURED)  # each text served once, in order
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_rule_vllms_series_can_feed_is_evaluated(capsys, clock):
    code, out, err = doctor(capsys, clock, "--max-num-seqs", "4", "--json")
    assert code == 0, err
    data = json.loads(out)
    s = data["summary"]
    assert s["metrics_source"] == "vllm" and s["window_s"] == 60.0
    assert s["scrape_samples"] == 5 and s["requests_finished"] == 48
    assert data["not_evaluable"] == NOT_FROM_VLLM
    # ITL (each token gap) and TPOT (each request's mean) from their own histograms: the
    # tail of the gaps is the prefill steps the streams waited out, which a request's
    # mean hides (the client measured ITL P99 311 ms, TPOT P99 61 ms)
    assert 0.3 < s["itl_p99_s"] <= 0.4 and 0.05 < s["tpot_p99_s"] <= 0.075
    assert s["p99_p50_tpot_ratio"] == pytest.approx(s["tpot_p99_s"] / s["tpot_p50_s"])
    # the rejections counter (vLLM's queue caps were not set: none refused)
    assert s["requests_total"] == 48 and s["requests_rejected"] == 0
    assert s["rejected_by_reason"] == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}
    assert s["waiting_by_reason_max"] == {"capacity": 28, "deferred": 0}
    assert s["waiting_by_reason_p50"] == {"capacity": 11, "deferred": 0}
    assert data["config"] == {"max_num_seqs": 4}
    assert data["settings_from"] == {"max_num_seqs": "--max-num-seqs"}
    found = {f["rule"]: f for f in data["findings"]}
    assert set(found) == {"running_below_offered", "prefill_stalls_decode"}
    rbo = found["running_below_offered"]["evidence"]
    assert "running peaked at 4 = max_num_seqs 4 x 1 replica(s)" in rbo
    assert "by reason: capacity peak 28, deferred peak 0" in rbo
    assert "up to 32 requests were in the engine" in rbo
    # ITL P99 against the TPOT P50 read at its wide bucket's upper bound, 50 ms; the
    # TTFT P50 it only quotes stays as interpolated (the client: 22.2 s)
    stall = found["prefill_stalls_decode"]["evidence"]
    assert "ITL P99 0.345 s is 7x the TPOT P50 (0.05 s" in stall
    assert "TTFT P50 22.2 s" in stall


def test_the_saved_summary_read_back_gives_the_same_verdict(tmp_path, capsys, clock):
    code, out, err = doctor(capsys, clock, "--max-num-seqs", "4", "--json")
    live = json.loads(out)
    saved = tmp_path / "window.json"
    saved.write_text(json.dumps({"runs": [{"name": "vllm", "config": live["config"],
                                           "summary": live["summary"]}]}))
    assert main(["doctor", str(saved), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [(f["rule"], f["evidence"]) for f in again["findings"]] == \
        [(f["rule"], f["evidence"]) for f in live["findings"]]


def test_wide_buckets_give_their_bounds_and_the_rules_read_them(capsys, clock):
    code, out, err = doctor(capsys, clock, "--json")
    assert code == 0, err
    data = json.loads(out)
    s, bounds = data["summary"], data["bounds"]
    # TTFT's 20-40 s bucket holds both the P50 and the P99 (the client: 22.2 s, 28.6 s)
    assert set(bounds) == {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s"}
    p99 = bounds["ttft_p99_s"]
    assert (p99["lower"], p99["upper"]) == (20.0, 40.0) and p99["rules_read"] == 20.0
    assert p99["interpolated"] == s["ttft_p99_s"] and 39 < s["ttft_p99_s"] < 40
    assert bounds["ttft_p50_s"]["rules_read"] == 40.0  # a median at its upper bound
    assert s["quantile_bounds"]["ttft_p99_s"] == {"lower": 20.0, "upper": 40.0}
    # E2E's P99 sits in 30-40 s: narrow enough that its interpolation stands
    assert "e2e_p99_s" not in bounds and 30 < s["e2e_p99_s"] <= 40


def test_the_text_report_says_the_same(capsys, clock):
    code, out, err = doctor(capsys, clock, "--max-num-seqs", "4")
    assert code == 0, err
    assert "[warning] running_below_offered" in out and "[warning] prefill_stalls_decode" in out
    assert "window: 5 scrapes over 60.0 s of vllm metrics; 48 requests finished" in out
    assert "waiting by reason: capacity peak 28, median 11; deferred peak 0, median 0" in out
    assert "TTFT P99 in 20-40 s (interpolated 39.6 s)" in out
    assert "a rule compares a tail (P99) at its bucket's lower bound" in out
    assert "settings from --max-num-seqs: max_num_seqs = 4" in out
    assert "not evaluable for lack of data: chunk_cap_eats_budget" in out
    assert "max_num_seqs unknown" not in out


def test_without_max_num_seqs_the_report_says_what_it_costs(capsys, clock):
    code, out, err = doctor(capsys, clock)
    assert code == 0, err
    assert ("max_num_seqs unknown (vllm publishes no scheduler settings; give "
            "--max-num-seqs N or --config FILE): not evaluated without it: "
            "throughput_over_experience") in out
    # the queue alone still says running sat below the offered load, without the cap
    assert "running peaked at 4; up to 32" in out


def test_a_vllm_serve_config_gives_the_settings(tmp_path, capsys, clock):
    # the server's own keys (model, port, ...) are skipped; the engine settings are read
    # as vLLM spells them, and a flag wins over the file
    config = tmp_path / "serve.yaml"
    config.write_text("model: /models/smollm2-135m-instruct\ndtype: float32\nport: 8765\n"
                      "served-model-name: smollm2\nmax-num-seqs: 4\n"
                      "max-num-batched-tokens: 2048\nenable-prompt-tokens-details: true\n")
    code, out, err = doctor(capsys, clock, "--config", str(config), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"] == {"max_num_seqs": 4, "max_num_batched_tokens": 2048}
    assert data["settings_from"] == {"max_num_seqs": f"--config {config}",
                                     "max_num_batched_tokens": f"--config {config}"}
    found = {f["rule"]: f for f in data["findings"]}
    assert "max_num_seqs 4 x 1" in found["running_below_offered"]["evidence"]
    assert "from 2048" in found["prefill_stalls_decode"]["action"]

    code, out, err = doctor(capsys, clock, "--config", str(config), "--max-num-seqs", "8",
                            "--json")
    data = json.loads(out)
    assert data["config"]["max_num_seqs"] == 8
    assert data["settings_from"]["max_num_seqs"] == "--max-num-seqs"
    # 4 running of 8 slots, no KV pressure: the step budget held them back, not the slots
    assert "running_below_offered" not in {f["rule"] for f in data["findings"]}


def test_admission_rejections_feed_the_rejections_rule(capsys, clock):
    # the after-load scrape as vLLM would show it had max_num_queued_reqs refused 12
    # more (its model_name label only: the API server counts them, not an engine)
    texts = captured_texts()
    line = 'vllm:admission_rejections_total{model_name="smollm2",reason="max_num_queued_reqs"}'
    assert f"{line} 0.0" in texts[-1]
    texts[-1] = texts[-1].replace(f"{line} 0.0", f"{line} 12.0")
    code, out, err = doctor(capsys, clock, "--json", texts=texts)
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"]["requests_total"] == 60 and data["summary"]["requests_rejected"] == 12
    (rej,) = [f for f in data["findings"] if f["rule"] == "rejections"]
    assert rej["severity"] == "critical"  # 20% of 60
    assert "20.0% of 60 requests were rejected at admission" in rej["evidence"]
    assert "max_num_queued_reqs (waiting + running) (12)" in rej["evidence"]
    assert "raise max_num_queued_reqs" in rej["action"]


@pytest.mark.parametrize("argv, message", [
    (("--max-num-seqs", "0"), "max_num_seqs = 0: must be an integer in [1, 65536]"),
    (("--config", "/nonexistent/serve.yaml"), "cannot be read"),
])
def test_a_bad_setting_is_one_line_and_exit_2(capsys, argv, message):
    code = main(["doctor", "--url", "http://127.0.0.1:9", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1
