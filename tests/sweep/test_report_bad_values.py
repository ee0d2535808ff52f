"""`stepserve report` refuses a result whose values `stepserve doctor` refuses, with the
doctor's own line (the file, the run, the key, what is allowed), exit 2, before any plot
is drawn: a 1e30 once overflowed the bar plot, and a -1e308 or a string became a page.
The largest values the check allows still plot."""

from __future__ import annotations

import json
import math

import pytest
from bench.test_vllm_files import VLLM_RESULT

from stepserve.cli import main
from stepserve.metrics.run_summary import MAGNITUDE_MAX, allowed
from stepserve.metrics.vllm_summary import NUMBER_KEYS
from stepserve.sim.run import run_scenario
from stepserve.sim.scenarios import get_scenario
from stepserve.workload.overrides import WorkloadOverrides

pytest.importorskip("matplotlib")

# (value, how the message shows it); NaN and Infinity are JSON our reader reads
BAD = [(1e30, "1e+30"), (-1e308, "-1e+308"), ("fast", "'fast'"), (math.nan, "nan"),
       (math.inf, "inf"), (-math.inf, "-inf")]
IMPOSSIBLE = "must be a finite number in [0, 1e+18]"


@pytest.fixture(scope="module")
def simulate_json():
    result = run_scenario(get_scenario("quickstart"), WorkloadOverrides(num_requests=20))
    return json.loads(json.dumps(result.to_json()))


def _write(tmp_path, data) -> str:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as JSON writes them
    return str(path)


def _refused(capsys, tmp_path, path: str, command: str) -> str:
    """The one line `command` (doctor or report) refuses the file with, exit 2."""
    capsys.readouterr()
    argv = ["report", path, "--out", str(tmp_path / "out")] if command == "report" \
        else ["doctor", path]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


def _refused_alike(capsys, tmp_path, path: str) -> str:
    """The report's refusal, the doctor's line to the letter, and no report written."""
    line = _refused(capsys, tmp_path, path, "report")
    assert not (tmp_path / "out").exists()
    assert _refused(capsys, tmp_path, path, "doctor") == line
    return line


@pytest.mark.parametrize(("value", "shown"), BAD)
def test_a_bad_summary_value_of_a_simulate_result_is_refused(simulate_json, tmp_path,
                                                             capsys, value, shown):
    data = json.loads(json.dumps(simulate_json))
    data["runs"][1]["summary"]["throughput_tokens_per_s"] = value
    path = _write(tmp_path, data)
    line = _refused_alike(capsys, tmp_path, path)
    expected = (f"values of the wrong type: summary.throughput_tokens_per_s = {shown} "
                "(a string): must be a number (or null)") if isinstance(value, str) else \
        f"impossible values: summary.throughput_tokens_per_s = {shown}: {IMPOSSIBLE}"
    assert line == f"error: {path}: run B: {expected}\n"


@pytest.mark.parametrize(("value", "shown"), BAD)
def test_every_summary_number_bad_is_refused_not_a_traceback(simulate_json, tmp_path,
                                                             capsys, value, shown):
    data = json.loads(json.dumps(simulate_json))
    for run in data["runs"]:
        summary = run["summary"]
        summary.update({k: value for k, v in summary.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    line = _refused_alike(capsys, tmp_path, _write(tmp_path, data))
    assert ": run A: " in line and f"summary.requests_total = {shown}" in line


def test_a_bad_config_value_is_refused_as_the_doctor_refuses_it(simulate_json, tmp_path,
                                                                capsys):
    data = json.loads(json.dumps(simulate_json))
    data["runs"][0]["config"]["scheduler"]["max_num_seqs"] = "lots"
    line = _refused_alike(capsys, tmp_path, _write(tmp_path, data))
    assert "run A: values of the wrong type: config.scheduler.max_num_seqs = 'lots' " \
        "(a string): must be a number (or null)" in line


@pytest.mark.parametrize(("value", "shown"), BAD)
def test_a_bad_value_of_a_vllm_result_is_refused(tmp_path, capsys, value, shown):
    path = _write(tmp_path, {**VLLM_RESULT, "output_throughput": value})
    line = _refused_alike(capsys, tmp_path, path)
    assert line == (f"error: {path}: run vllm: values a vLLM bench result cannot have: "
                    f"output_throughput = {shown}: {IMPOSSIBLE} (or null)\n")


@pytest.mark.parametrize(("value", "shown"), BAD)
def test_every_number_of_a_vllm_result_bad_is_refused(tmp_path, capsys, value, shown):
    data = {k: value if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in VLLM_RESULT.items()}
    line = _refused_alike(capsys, tmp_path, _write(tmp_path, data))
    assert f"run vllm: values a vLLM bench result cannot have: completed = {shown}: " in line


@pytest.mark.parametrize(("key", "entries", "named"), [
    ("ttfts", [0.1, "soon", 0.2, 0.0], "ttfts[1] = 'soon'"),
    ("ttfts", [0.1, 0.3, math.nan, 0.0], "ttfts[2] = nan"),
    ("itls", [[0.02, 1e300], [0.04], [], []], "itls[0][1] = 1e+300"),
    ("itls", [[0.02], 0.04, [], []], "itls[1] = 0.04: must be a list of numbers"),
])
def test_a_bad_per_request_entry_of_a_vllm_result_is_refused(tmp_path, capsys, key, entries,
                                                             named):
    line = _refused_alike(capsys, tmp_path, _write(tmp_path, {**VLLM_RESULT, key: entries}))
    assert f"run vllm: values a vLLM bench result cannot have: {named}" in line


def _report(tmp_path, capsys, data) -> None:
    out = tmp_path / "out"
    assert main(["report", _write(tmp_path, data), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert (out / "index.html").exists() and (out / "knee.png").read_bytes()[:4] == b"\x89PNG"


def test_the_largest_and_smallest_allowed_summary_values_still_plot(simulate_json,
                                                                    tmp_path, capsys):
    data = json.loads(json.dumps(simulate_json))
    for i, run in enumerate(data["runs"]):  # run A at every upper bound, B just above 0
        summary = run["summary"]
        summary.update({k: allowed(k).hi if i % 2 == 0 else max(allowed(k).lo, 5e-324)
                        for k, v in summary.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    _report(tmp_path, capsys, data)


def test_the_largest_allowed_vllm_values_still_plot(tmp_path, capsys):
    data = {**VLLM_RESULT, **{k: MAGNITUDE_MAX for k in NUMBER_KEYS if k in VLLM_RESULT},
            "failed": 0, "request_goodput": 1.0}  # goodput x duration is a count too
    _report(tmp_path, capsys, data)


@pytest.mark.parametrize(("where", "value", "named"), [
    (("by_class",), 7, "by_class = 7: must be an object"),
    (("by_class", "chat"), 1.5, "by_class.chat = 1.5: must be a summary object"),
    (("by_class", "chat", "ttft_p99_s"), 1e30, "summary.ttft_p99_s = 1e+30"),
    (("timeseries", "waiting", 0), math.nan, "timeseries.waiting[0] = nan"),
    (("timeseries", "t"), "soon", "timeseries.t = 'soon': must be a list of numbers"),
    (("latency_samples", "ttft_s", 0), -1.0, "latency_samples.ttft_s[0] = -1"),
])
def test_the_plotted_parts_of_a_run_are_checked_too(simulate_json, tmp_path, capsys, where,
                                                    value, named):
    data = json.loads(json.dumps(simulate_json))
    node = data["runs"][0]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    assert named in _refused_alike(capsys, tmp_path, _write(tmp_path, data))
