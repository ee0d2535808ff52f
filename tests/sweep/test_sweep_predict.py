"""`sweep --target URL --predict cost.json`: the live points run again in the simulator
as a second series, on the settings the server publishes (here max_num_seqs 2), with the
same requests; both knees and recommendations, one line on whether they agree, both
curves in the report. Whether they agree on a given machine is the fidelity benchmark's
question (docs/benchmarks.md), not this test's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi")
pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).parent.parent / "server"))

from server_harness import make_engine, serve  # noqa: E402

from stepserve.sim.calibrated import CalibratedCost  # noqa: E402


@pytest.fixture(scope="module")
def two_slot_server():
    with serve(make_engine(max_num_seqs=2)) as s:
        yield s


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    workload = tmp_path / "short.yaml"
    workload.write_text(yaml.safe_dump({
        "name": "short", "num_requests": 12, "arrival": {"poisson": {"rate": 1.0}},
        "classes": [{"name": "chat", "share": 1.0, "prompt": {"fixed": 16},
                     "output": {"fixed": 8}}]}))
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(CalibratedCost(
        {"step": 0.004, "seq": 2e-4, "token": 5e-5}, 64,
        {"model": "tiny", "hardware": "test", "kv_cache_bytes": 2**26,
         "kv_bytes_per_token": 1024}).to_json()))
    return {"workload": workload, "cost": cost, "dir": tmp_path}


def test_predicted_series_beside_the_measured_one(two_slot_server, files, cli, capsys):
    out, report = files["dir"] / "sweep.json", files["dir"] / "report"
    assert cli(["sweep", "--target", two_slot_server.url, "--workload",
                str(files["workload"]), "--vary", "rate=2,8,32", "--requests", "12",
                "--predict", str(files["cost"]), "--quiet", "--json", str(out),
                "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert "series predicted:" in text and "measured recommends" in text
    data = json.loads(out.read_text())
    series = {}
    for run in data["runs"]:
        series.setdefault(run["sweep"]["series"], []).append(run)
    assert set(series) == {"server", "predicted"}
    assert [r["sweep"]["x"] for r in series["predicted"]] == [2.0, 8.0, 32.0]
    for run in series["predicted"]:
        # the server's published settings, the same 12 requests
        assert run["config"]["scheduler"]["max_num_seqs"] == 2
        assert run["summary"]["requests_total"] == 12
    assert {k["series"] for k in data["knees"]} == {"server", "predicted"}
    assert data["cost_model"].startswith("predicted with")
    assert (report / "index.html").is_file()


def test_predict_needs_a_live_target(files, cli, capsys):
    assert cli(["sweep", "--workload", str(files["workload"]), "--vary", "rate=1,2",
                "--predict", str(files["cost"])]) == 2
    assert "--predict FILE compares a live sweep" in capsys.readouterr().err
