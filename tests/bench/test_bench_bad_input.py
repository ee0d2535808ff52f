"""Bad input to the client: each gives a clear message, not a traceback; server errors
mid-run are counted; an interrupted run still writes its partial result."""

from __future__ import annotations

import _thread
import json
import threading

import pytest
from fake_server import run_fake
from server_harness import free_port

from stepserve.cli import main

SMALL = ["--random-input-len", "4", "--random-output-len", "3", "--no-progress"]


def test_unreachable_target(capsys, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["bench", "--target", url, *SMALL, "--num-prompts", "2",
                 "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot reach target {url}" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_server_errors_are_counted(tmp_path, capsys):
    out = tmp_path / "r.json"
    with run_fake(fail_every=3) as fake:
        rc = main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "9",
                   "--max-concurrency", "3", "--json", str(out), "--csv",
                   str(tmp_path / "r.csv")])
    assert rc == 0
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["requests_total"] == 9 and s["requests_finished"] == 6
    assert s["requests_failed"] == 3 and s["errors"] == {"http_500": 3}
    assert s["scrape_samples"] == 0 and s["metrics_source"] is None  # no /metrics there
    assert "errors                     http_500 3" in capsys.readouterr().out
    assert "HTTP 500: boom" in (tmp_path / "r.csv").read_text()


def test_stream_errors_mid_response_are_counted(tmp_path):
    out = tmp_path / "r.json"
    with run_fake(stream_error_every=2) as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "6",
                     "--max-concurrency", "1", "--json", str(out)]) == 0
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["requests_finished"] == 3 and s["errors"] == {"stream_error": 3}
    assert s["error_examples"]["stream_error"] == "stream error: engine died"
    assert s["output_tokens"] == 9  # only completed requests count


def test_malformed_workload_file(tmp_path, capsys):
    bad = tmp_path / "w.yaml"
    bad.write_text("arrival: {poisson: {rate: 1}}\nnum_requests: 3\nclasses: [{name: a}]\n")
    assert main(["bench", "--sim", "--workload", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "error: workload file" in err and "classes[0]" in err and "Traceback" not in err
    bad.write_text("arrival: [unclosed\n")
    assert main(["bench", "--sim", "--workload", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("slo, says", [("ttft:abc", "'ttft:abc': 'abc' is not a number"),
                                       ("p99:5", "unknown key 'p99' (keys: ttft, tpot, e2el)")])
def test_bad_slo(slo, says, capsys):
    assert main(["bench", "--sim", *SMALL, "--num-prompts", "2", "--goodput", slo]) == 2
    assert says in capsys.readouterr().err


def test_conflicting_workloads_and_bad_arrivals(capsys):
    assert main(["bench", "--sim", *SMALL, "--scenario", "quickstart"]) == 2
    assert "give one workload" in capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--dataset-name", "sonnet"]) == 2
    assert "--dataset-name 'sonnet': this bench reads random, sharegpt" in \
        capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--request-rate", "0"]) == 2
    assert "--request-rate = 0: must be a finite number in" in capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--max-concurrency", "2",
                 "--request-rate", "3"]) == 2  # a gated open loop: not on the simulator
    assert "needs --target or --engine" in capsys.readouterr().err


def test_interrupt_writes_partial_result(tmp_path, capsys):
    out, table = tmp_path / "p.json", tmp_path / "p.csv"
    with run_fake(delay_s=0.05) as fake:
        timer = threading.Timer(1.0, _thread.interrupt_main)  # as Ctrl-C would
        timer.start()
        try:
            rc = main(["bench", "--target", fake.url, "--random-input-len", "4",
                       "--random-output-len", "40", "--no-progress", "--num-prompts", "50",
                       "--max-concurrency", "2", "--json", str(out), "--csv", str(table)])
        finally:
            timer.cancel()
    assert rc == 130
    assert "interrupted" in capsys.readouterr().err
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["interrupted"] is True
    assert 0 < s["requests_total"] < 50 and s["requests_not_sent"] > 0
    assert s["errors"].get("interrupted") == 2  # the two in flight were cut off
    assert len(table.read_text().splitlines()) == 51


def test_open_loop_shapes_on_fake_server(tmp_path):
    out = tmp_path / "a.json"
    with run_fake(delay_s=0.02) as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "8",
                     "--request-rate", "inf", "--json", str(out)]) == 0
        s = json.loads(out.read_text())["runs"][0]["summary"]
        assert s["requests_finished"] == 8 and s["peak_concurrency"] == 8  # all at once
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "400",
                     "--request-rate", "20", "--burstiness", "0.5", "--duration-s", "0.5",
                     "--json", str(out)]) == 0
        s = json.loads(out.read_text())["runs"][0]["summary"]
        assert 0 < s["requests_total"] < 100 and s["requests_not_sent"] > 300
