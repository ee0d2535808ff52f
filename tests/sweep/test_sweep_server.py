"""`stepserve sweep --target` over request rate against our own server on 127.0.0.1
(tiny model, 2 batch slots so the load saturates it quickly): every point measured, the
counts agree with the server's /metrics, a knee found, the report written with plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi")
pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).parent.parent / "server"))

from server_harness import free_port, make_engine, serve  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REQUESTS = 40
OUTPUT_TOKENS = 16


@pytest.fixture(scope="module")
def small_server():
    with serve(make_engine(max_num_seqs=2)) as s:
        yield s


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump({
        "name": "short", "num_requests": REQUESTS, "arrival": {"poisson": {"rate": 1.0}},
        "classes": [{"name": "chat", "share": 1.0, "prompt": {"fixed": 16},
                     "output": {"fixed": OUTPUT_TOKENS}}]}))
    return path


def _capacity_req_per_s(url: str, workload: Path, tmp_path: Path) -> float:
    """What the server sustains with both slots busy (closed loop, 2 in flight)."""
    from stepserve.cli import main as bench

    out = tmp_path / "probe.json"
    assert bench(["bench", "--target", url, "--workload", str(workload), "--max-concurrency",
                  "2", "--num-prompts", str(REQUESTS), "--no-progress", "--json",
                  str(out)]) == 0
    return json.loads(out.read_text())["runs"][0]["summary"]["throughput_requests_per_s"]


@pytest.mark.timing  # where the knee falls follows the server's measured speed
@pytest.mark.serial  # so it is measured alone, not beside the other worker
def test_rate_sweep_on_our_server_finds_the_knee_and_writes_the_report(
        small_server, workload, tmp_path, cli, capsys):
    small_server.wait_idle()
    capacity = _capacity_req_per_s(small_server.url, workload, tmp_path)
    small_server.wait_idle()
    before = small_server.metrics()
    out, report = tmp_path / "sweep.json", tmp_path / "report"
    # Rates around the measured capacity, as a user would pick them: half of it (the
    # server keeps up), 1.5x and 20x (both saturate it). Past capacity, throughput stays at
    # the server's rate while the first-token wait of a fixed request count grows with the
    # arrival rate, about N * (1/capacity - 1/rate): from N/(3 capacity) to 0.95
    # N/capacity, nearly 3x. Throughput is not quite flat past capacity: the closed-loop
    # probe leaves a slot idle for each client round trip, so it reads the capacity low
    # (25 req/s where a burst runs at 31), and 40 requests spread over a second still ramp
    # up. CI runs gained +54%/+35%, +35%/+22% and +55%/+46% (0.5x to 1.5x, 1.5x to 20x);
    # a gain under 60% counts as flat, so the knee is at 1.5x or at 20x, never below
    # capacity, and only two gains of 60% in a row (a probe off by more than half) miss it.
    rates = [round(capacity * f, 1) for f in (0.5, 1.5, 20)]
    rc = cli(["sweep", "--target", small_server.url, "--workload", str(workload),
              "--vary", "rate=" + ",".join(map(str, rates)), "--requests", str(REQUESTS),
              "--min-throughput-gain", "0.6", "--max-p99-rise", "0.3",
              "--metrics-interval-s", "0.1", "--quiet",
              "--json", str(out), "--report", str(report)])
    text = capsys.readouterr().out
    assert rc == 0, text
    after = small_server.metrics()
    result = json.loads(out.read_text())
    assert result["target"] == small_server.url and result["x_axis"] == "rate"
    runs = result["runs"]
    assert [r["sweep"]["x"] for r in runs] == rates
    for run in runs:
        s = run["summary"]
        assert s["requests_finished"] == REQUESTS and s["requests_failed"] == 0
        assert s["output_tokens"] == REQUESTS * OUTPUT_TOKENS
        assert s["server_requests_finished"] == REQUESTS  # the server's own count agrees
        assert s["metrics_source"] == "stepserve" and s["running_max"] <= 2
        assert run["latency_samples"]["count"] == REQUESTS
        ts = run["timeseries"]
        assert len(ts["t"]) >= 2 and sum(ts["decode_tokens"]) == REQUESTS * OUTPUT_TOKENS
        assert sum(ts["steps"]) > 0
    done = after["stepserve:request_success_total"] - before["stepserve:request_success_total"]
    assert done == 3 * REQUESTS
    # saturated: the queue builds higher at 20x capacity than at half of it
    assert runs[2]["summary"]["waiting_max"] > runs[0]["summary"]["waiting_max"]
    (knee,) = result["knees"]
    # saturated past capacity (1.5x or 20x: where it lands depends on how much a burst
    # still gains on this machine, see the rates above); the knee is the last point before
    # the tail's jump into it
    assert knee["saturated_index"] in (1, 2), text
    assert knee["knee_index"] is not None and knee["knee_index"] < knee["saturated_index"]
    assert knee["recommended_index"] is not None
    assert knee["recommended_index"] <= knee["knee_index"]
    assert "<- knee" in text
    page = (report / "index.html").read_text()
    assert "data:image/png;base64," in page and "live server" in page
    for name in ("knee.png", "cdf_ttft.png", "ts_waiting.png", "ts_running.png",
                 "ts_tokens_per_step.png"):
        data = (report / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name


def test_a_live_sweep_refuses_what_a_server_cannot_change(small_server, workload, cli,
                                                          capsys):
    base = ["sweep", "--target", small_server.url, "--workload", str(workload), "--quiet"]
    assert cli([*base, "--vary", "max_num_seqs=2,4"]) == 2
    assert "settings cannot be varied" in capsys.readouterr().err
    assert cli([*base, "--vary", "rate=1,2", "--max-num-seqs", "8"]) == 2
    assert "restart it with them" in capsys.readouterr().err
    assert cli([*base]) == 2
    assert "needs --vary rate" in capsys.readouterr().err
    assert cli([*base, "--vary", "rate=1", "--requests", "10", "--warmup", "99"]) == 2
    assert "--warmup 99" in capsys.readouterr().err


def test_an_unreachable_target_is_a_clear_error(workload, cli, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert cli(["sweep", "--target", url, "--workload", str(workload), "--vary",
                "rate=1,2", "--quiet"]) == 2
    assert f"cannot reach target {url}" in capsys.readouterr().err
