"""`stepserve doctor --url` against a small stdlib HTTP server that serves canned
/metrics texts (a vLLM window), HTTP errors, or metrics of no known server."""

import argparse
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from metrics.canned_texts import rising_vllm_texts, vllm_text

from stepserve.cli.doctor import add_doctor_parser
from stepserve.metrics import bounded_scrape


def doctor(*argv) -> int:
    p = argparse.ArgumentParser()
    add_doctor_parser(p.add_subparsers())
    args = p.parse_args(["doctor", *map(str, argv)])
    return args.func(args)


FAST = ("--window-s", "0.2", "--interval-s", "0.02")  # 11 scrapes


class ScrapeClock:
    """The scrapes' clock, counted instead of read: the doctor's i-th scrape (GET i, from
    0) is taken at i * 0.02 s, FAST's interval, where it would be on an idle machine. On a
    busy one the real scrapes come late and the window's printed length with them; what
    the report says of the scrapes it did is the point here, not how punctual they were."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gets = 0
        # the time a scrape is stamped with (the doctor still paces on the real clock)
        monkeypatch.setattr(bounded_scrape, "time",
                            SimpleNamespace(monotonic=lambda: 0.02 * (self.gets - 1)))


@pytest.fixture
def scrape_clock(monkeypatch) -> ScrapeClock:
    return ScrapeClock(monkeypatch)


@contextmanager
def metrics_server(texts: list[str], status: int = 200,
                   failing: frozenset[int] = frozenset(),
                   clock: ScrapeClock | None = None) -> Iterator[str]:
    """Serves texts[i] on the i-th GET (the last one again once they run out); the GETs
    numbered in `failing` (from 0) get a 503 instead. `clock` counts the GETs."""
    served = iter(range(10**9))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            i = next(served)
            if clock is not None:
                clock.gets = i + 1
            body = texts[min(i, len(texts) - 1)].encode()
            self.send_response(503 if i in failing else status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_text_report_of_a_live_vllm_window(capsys, scrape_clock):
    with metrics_server(rising_vllm_texts(), clock=scrape_clock) as url:
        assert doctor("--url", url, *FAST) == 0
    assert scrape_clock.gets == 11
    out = capsys.readouterr().out
    assert f"run {url}: " in out
    for rule in ("[critical] capacity", "[warning] queue_growing",
                 "[warning] preemption_nonzero"):
        assert rule in out
    assert "window: 11 scrapes over 0.2 s of vllm metrics; 20 requests finished" in out
    assert "not evaluable for lack of data: chunk_cap_eats_budget (needs " in out
    assert "low_active_ratio (needs active_ratio_p50 or slot_utilization or active_ratio_mean)" in out


def test_json_report_carries_the_summary_and_what_could_not_be_evaluated(capsys):
    with metrics_server(rising_vllm_texts()) as url:
        assert doctor("--url", url + "/metrics", *FAST, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    # the TTFT buckets of this window are wide (0.05-0.1 s, 5-10 s): their bounds come too
    assert set(data) == {"findings", "summary", "config", "not_evaluable", "failed_scrapes",
                         "bounds"}
    assert data["bounds"]["ttft_p99_s"]["lower"] == 5.0
    assert data["failed_scrapes"] == []
    assert {"capacity", "queue_growing", "preemption_nonzero"} <= \
        {r["rule"] for r in data["findings"]}
    for r in data["findings"]:
        assert set(r) == {"run", "rule", "severity", "evidence", "action"}
    assert data["summary"]["metrics_source"] == "vllm" and data["summary"]["preemptions"] == 7
    assert data["config"] == {}
    assert "low_active_ratio" in data["not_evaluable"]


def test_a_quiet_window_says_nothing_finished(capsys):
    flat = vllm_text(waiting=0, preempted=0, fast=0, slow=0, stop=3)
    with metrics_server([flat]) as url:
        assert doctor("--url", url, "--window-s", "0.05", "--interval-s", "1") == 0
    out = capsys.readouterr().out
    assert "no rule fires" in out and "window: 2 scrapes" in out
    assert "no request finished in the window: no latency quantiles" in out


def _error(capsys, *argv) -> str:
    assert doctor(*argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ")
    return captured.err


def test_http_error_and_unknown_metrics_exit_2(capsys):
    with metrics_server(["oops"], status=500) as url:
        err = _error(capsys, "--url", url, *FAST)
    assert "answered HTTP 500" in err and "expected 200" in err
    with metrics_server(["process_cpu_seconds_total 3.0\n"]) as url:
        err = _error(capsys, "--url", url, *FAST)
    assert "no series with a known prefix (stepserve:, vllm:, sglang:, tgi_, llamacpp:)" in err
    assert "stepserve, vLLM, SGLang or TGI" in err


def test_exactly_one_of_file_or_url(tmp_path, capsys):
    assert "exactly one of RESULT.json" in _error(capsys)
    assert "exactly one of RESULT.json" in _error(capsys, tmp_path / "r.json", "--url",
                                                  "http://127.0.0.1:9")
    assert "http:// or https://" in _error(capsys, "--url", "127.0.0.1:8000")
    assert "--interval-s = 0: must be" in _error(capsys, "--url", "http://127.0.0.1:9",
                                                 "--interval-s", "0")


# ---- one failed scrape does not end the window ----

def test_a_failed_scrape_in_the_window_is_skipped_and_reported(capsys, scrape_clock):
    with metrics_server(rising_vllm_texts(), failing=frozenset({4}),
                        clock=scrape_clock) as url:
        assert doctor("--url", url, *FAST) == 0
    out = capsys.readouterr().out
    assert "[critical] capacity" in out  # the findings still come
    assert "window: 10 scrapes over 0.2 s of vllm metrics" in out
    assert "1 scrape(s) failed and were skipped; the first: scrape 5: " in out
    assert "answered HTTP 503" in out


def test_a_failed_first_scrape_is_retried(capsys):
    with metrics_server(rising_vllm_texts(), failing=frozenset({0})) as url:
        assert doctor("--url", url, *FAST, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["scrape_samples"] == 11
    assert len(data["failed_scrapes"]) == 1 and "HTTP 503" in data["failed_scrapes"][0]


def test_a_window_with_under_two_good_scrapes_is_an_error(capsys):
    with metrics_server(rising_vllm_texts(), failing=frozenset(range(1, 100))) as url:
        err = _error(capsys, "--url", url, *FAST)
    assert "only 1 of 11 scrapes" in err and "a window needs two" in err


def test_label_values_with_commas_and_quotes_survive_a_scrape():
    from stepserve.config.settings import SchedulerConfig
    from stepserve.metrics.live_window import scrape_window
    from stepserve.server.metrics import ServerMetrics

    name = 'org/model,v2 "chat"'
    metrics = ServerMetrics(name, SchedulerConfig(max_num_seqs=7), engine="1")
    metrics.waiting.set(2)
    with metrics_server([metrics.render().decode()]) as url:
        snap = scrape_window(url + "/metrics", 0.01, 0.01).snapshots[-1]
    ours = [dict(ls) for n, ls in snap.samples if n.startswith("stepserve:")]
    assert ours and {(ls["model_name"], ls["engine"]) for ls in ours} == {(name, "1")}
    assert snap.level("waiting") == 2.0
    assert snap.info()["max_num_seqs"] == "7" and "engine" not in snap.info()


def _non_finite_texts() -> list[str]:
    """The rising window with values the exposition format allows but no arithmetic
    takes: the last scrape's preemption counter +Inf, a TTFT bucket NaN, the queue -Inf."""
    texts = rising_vllm_texts()
    last = texts[-1].splitlines()
    for i, line in enumerate(last):
        if line.startswith("vllm:num_preemptions_total"):
            last[i] = line.rsplit(" ", 1)[0] + " +Inf"
        elif line.startswith("vllm:time_to_first_token_seconds_bucket") and 'le="5.0"' in line:
            last[i] = line.rsplit(" ", 1)[0] + " NaN"
        elif line.startswith("vllm:num_requests_waiting"):
            last[i] = line.rsplit(" ", 1)[0] + " -Inf"
    texts[-1] = "\n".join(last) + "\n"
    return texts


def test_non_finite_samples_are_read_as_missing_and_named(capsys):
    with metrics_server(_non_finite_texts()) as url:
        assert doctor("--url", url, *FAST) == 0
        out = capsys.readouterr().out
        assert ("3 series held NaN or infinite values, read as missing: "
                "vllm:num_preemptions_total, vllm:num_requests_waiting, "
                "vllm:time_to_first_token_seconds_bucket") in out
        assert doctor("--url", url, *FAST, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["non_finite_series"] == ["vllm:num_preemptions_total",
                                         "vllm:num_requests_waiting",
                                         "vllm:time_to_first_token_seconds_bucket"]
    # the last scrape's preemption counter is missing, so the window has no increase
    assert data["summary"]["preemptions"] is None
