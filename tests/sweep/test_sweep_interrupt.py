"""Ctrl-C during a sweep keeps the points measured before it: the result is printed and
written, marked interrupted, and the exit status is 130; a target lost mid-sweep keeps
them too (exit 2). Also: a target without /metrics is swept all the same (no time
series, a note in the report), and a point where every request fails is reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi")
sys.path.insert(0, str(Path(__file__).parent.parent / "server"))
sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

from fake_server import run_fake  # noqa: E402

from stepserve.sweep import points  # noqa: E402


def _interrupt_on_call(n: int, real):
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt  # as Ctrl-C would, mid-point
        return real(*args, **kwargs)

    return wrapper


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({
        "name": "w", "num_requests": 6, "arrival": {"poisson": {"rate": 1.0}},
        "classes": [{"name": "c", "share": 1.0, "prompt": {"fixed": 4},
                     "output": {"fixed": 3}}]}))
    return path


def test_interrupted_live_sweep_keeps_the_points_before_it(monkeypatch, workload, tmp_path,
                                                           cli, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(points, "bench_http", _interrupt_on_call(3, points.bench_http))
    out, report = tmp_path / "s.json", tmp_path / "r"
    with run_fake(tokens=3) as fake:  # no /metrics
        rc = cli(["sweep", "--target", fake.url, "--workload", str(workload), "--vary",
                  "rate=50,100,200,400", "--requests", "6", "--quiet", "--json", str(out),
                  "--report", str(report)])
    assert rc == 130
    assert "interrupted: 2 of 4 points measured" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["interrupted"] is True
    assert [r["sweep"]["x"] for r in result["runs"]] == [50.0, 100.0]
    for run in result["runs"]:
        assert run["summary"]["requests_finished"] == 6
        assert run["summary"]["scrape_samples"] == 0 and "timeseries" not in run
    page = (report / "index.html").read_text()
    assert "no `timeseries` in the JSON" in page and (report / "cdf_ttft.png").exists()


def test_interrupted_sim_sweep_keeps_the_points_before_it(monkeypatch, tmp_path, cli,
                                                          capsys):
    monkeypatch.setattr(points, "simulate_run", _interrupt_on_call(2, points.simulate_run))
    out = tmp_path / "s.json"
    rc = cli(["sweep", "--scenario", "quickstart", "--scenario-runs", "A", "--vary",
              "rate=4,8,16", "--requests", "50", "--quiet", "--json", str(out)])
    assert rc == 130
    assert "1 of 3 points measured" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and len(result["runs"]) == 1


def test_interrupt_before_the_first_point_writes_nothing(monkeypatch, tmp_path, cli, capsys):
    monkeypatch.setattr(points, "simulate_run", _interrupt_on_call(1, points.simulate_run))
    out = tmp_path / "s.json"
    assert cli(["sweep", "--scenario", "quickstart", "--vary", "rate=4,8", "--requests",
                "50", "--quiet", "--json", str(out)]) == 130
    assert "nothing to report" in capsys.readouterr().err and not out.exists()


def test_a_target_lost_mid_sweep_keeps_the_points_before_it(monkeypatch, workload, tmp_path,
                                                            cli, capsys):
    from stepserve.bench.workload_options import BenchError

    real = points.bench_http
    calls = []

    def lost_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise BenchError("cannot reach target http://x: ConnectError")
        return real(*args, **kwargs)

    monkeypatch.setattr(points, "bench_http", lost_on_second)
    out = tmp_path / "s.json"
    with run_fake(tokens=3) as fake:
        rc = cli(["sweep", "--target", fake.url, "--workload", str(workload), "--vary",
                  "rate=50,100,200", "--requests", "6", "--quiet", "--json", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "stopped at server rate=100: cannot reach target" in err and "1 of 3" in err
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 1 and result["stopped"].startswith("stopped at")


def test_a_point_where_every_request_fails_is_reported_not_fatal(workload, tmp_path, cli,
                                                                  capsys):
    out = tmp_path / "s.json"
    with run_fake(tokens=3, fail_every=1) as fake:
        rc = cli(["sweep", "--target", fake.url, "--workload", str(workload), "--vary",
                  "rate=50,100", "--requests", "6", "--json", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "0/6 done, 6 failed" in captured.err and "knee: none" in captured.out
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["requests_failed"] == 6 and s["errors"] == {"http_500": 6}
