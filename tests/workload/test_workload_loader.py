"""YAML workloads and JSONL traces: loading, saving, round trips and bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from stepserve.config.limits import MAX_LEN, MAX_WORKLOAD_TOKENS
from stepserve.workload import (
    ClosedLoop,
    Gamma,
    LogNormal,
    Poisson,
    TraceReplay,
    Uniform,
    WorkloadError,
    get_workload,
    load_trace,
    load_workload,
    save_trace,
    save_workload,
    workload_from_dict,
    workload_to_dict,
)

MIXED_YAML = """
name: mixed
seed: 1
num_requests: 2000
arrival: {poisson: {rate: 5.0}}
classes:
  - {name: summary, share: 0.3, prompt: {fixed: 8192}, output: {fixed: 200}}
  - {name: chat, share: 0.7, prompt: {lognormal: {p50: 300, p99: 900}},
     output: {uniform: [50, 400]}, priority: 0, tenant: a}
"""


def make_dict(**overrides) -> dict:
    return yaml.safe_load(MIXED_YAML) | overrides


def test_load_the_documented_example(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED_YAML)
    w = load_workload(path)
    assert (w.name, w.seed, w.num_requests, w.arrival) == ("mixed", 1, 2000, Poisson(5.0))
    summary, chat = w.classes
    assert summary.share == 0.3 and chat.prompt == LogNormal(300, 900)
    assert chat.output == Uniform(50, 400) and chat.tenant == "a"
    assert len(w.generate()) == 2000


@pytest.mark.parametrize("arrival,expected", [
    ({"closed_loop": {"concurrency": 64}}, ClosedLoop(64)),
    ({"gamma": {"rate": 5, "burstiness": 0.5}}, Gamma(5.0, 0.5)),
])
def test_other_arrivals(arrival, expected):
    assert workload_from_dict(make_dict(arrival=arrival)).arrival == expected


def test_name_defaults_to_the_file_stem(tmp_path):
    data = make_dict()
    del data["name"]
    path = tmp_path / "night.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_workload(path).name == "night"


@pytest.mark.parametrize("name", ["night-report", "mixed-pool", "promo-spike", "quickstart"])
def test_workload_yaml_round_trip(tmp_path, name):
    w = get_workload(name, num_requests=200)
    path = save_workload(w, tmp_path / "w.yaml")
    again = load_workload(path)
    assert again == w
    assert again.generate() == w.generate()
    assert workload_to_dict(again) == workload_to_dict(w)


def test_trace_round_trip(tmp_path):
    specs = get_workload("mixed-pool", num_requests=300).generate()
    path = save_trace(specs, tmp_path / "trace.jsonl")
    assert load_trace(path) == specs
    assert len(path.read_text().splitlines()) == 300


def test_trace_round_trip_keeps_caps_priorities_and_estimates(tmp_path):
    w = workload_from_dict(make_dict(classes=[
        {"name": "c", "prompt": 10, "output": {"uniform": [1, 50]}, "max_tokens": 30,
         "priority": 3, "tenant": "t", "length_estimate": "exact"}]))
    specs = w.generate()
    assert load_trace(save_trace(specs, tmp_path / "t.jsonl")) == specs


def test_trace_as_arrival(tmp_path):
    specs = get_workload("mixed-pool", num_requests=50).generate()
    save_trace(specs, tmp_path / "t.jsonl")
    w = workload_from_dict({"name": "replay", "arrival": {"trace": "t.jsonl"}}, tmp_path)
    assert isinstance(w.arrival, TraceReplay) and w.num_requests == 50
    assert w.generate() == specs
    first10 = workload_from_dict({"arrival": {"trace": "t.jsonl"}, "num_requests": 10}, tmp_path)
    assert first10.generate() == specs[:10]
    closed = workload_from_dict(
        {"arrival": {"trace": {"path": "t.jsonl", "concurrency": 8}}}, tmp_path)
    assert closed.closed_loop_concurrency == 8
    assert [s.arrival_s for s in closed.generate()] == [0.0] * 50
    assert workload_from_dict(workload_to_dict(closed), tmp_path) == closed


def test_trace_defaults_and_sorting(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 2.0, "prompt_len": 5, "output_len": 3}\n\n'
                    '{"arrival_s": 1, "prompt_len": 7, "output_len": 4, "max_tokens": 9,'
                    ' "class": "x"}\n')
    first, second = load_trace(path)
    assert (first.index, first.arrival_s, first.max_tokens, first.request_class) == \
        (0, 1.0, 9, "x")
    assert (second.index, second.max_tokens, second.tenant, second.priority) == \
        (1, 3, "default", 0)


@pytest.mark.parametrize("lines,message", [
    (['{"arrival_s": 0, "prompt_len": 5, "output_len": 3}', '{"arrival_s": 1,'],
     r"line 2: not valid JSON"),
    (['{"arrival_s": 0, "prompt_len": 0, "output_len": 3}'],
     r"line 1: prompt_len = 0: must be an integer in \[1, 1048576\]"),
    (['{"arrival_s": 0, "prompt_len": 5}'], r"line 1: missing required key 'output_len'"),
    (['{"arrival_s": 0, "prompt_len": 5, "output_len": 3, "user": "u"}'],
     r"line 1: unknown key 'user'; allowed keys: arrival_s, prompt_len, output_len"),
    (['{"arrival_s": -1, "prompt_len": 5, "output_len": 3}'], r"line 1: arrival_s = -1"),
    (['{"arrival_s": 0, "prompt_len": 5, "output_len": 9, "max_tokens": 4}'],
     r"line 1: output_len = 9: must be <= max_tokens = 4"),
    (['[1, 2, 3]'], r"line 1: \[1, 2, 3\]: must be a JSON object"),
    ([''], r"holds no requests"),
])
def test_bad_traces_name_the_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=message):
        load_trace(path)


def test_missing_trace_file():
    with pytest.raises(WorkloadError, match="cannot be read"):
        load_trace("/nonexistent/trace.jsonl")


@pytest.mark.parametrize("changes,message", [
    ({"rate": 5}, r"workload: unknown key 'rate'; allowed keys: name, description, seed"),
    ({"arrival": {"poisson": {"rate": -2}}}, r"arrival\.poisson\.rate = -2: must be"),
    ({"classes": [{"name": "a", "share": 0, "prompt": 1, "output": 1}]},
     r"classes\[0\]\.share = 0: must be a finite number in \(0, "),
    ({"classes": [{"name": "a", "prompt": 1, "output": 1, "weight": 2}]},
     r"classes\[0\]: unknown key 'weight'; allowed keys: name, share, prompt, output"),
    ({"classes": [{"name": "a", "prompt": 1}]}, r"classes\[0\]: missing required key 'output'"),
    ({"classes": [{"name": "a", "prompt": 1,
                   "output": {"lognormal": {"p50": 50, "p99": 10}}}]},
     r"classes\[0\]\.output\.lognormal\.p99 = 10: must be >= lognormal\.p50 = 50"),
    ({"classes": [{"name": "a", "prompt": 1, "output": {"mixture": []}}]},
     r"classes\[0\]\.output\.mixture = \[\]: must be a non-empty list"),
    ({"classes": {"name": "a"}}, r"classes = .*: must be a list of request classes"),
    ({"classes": []}, r"classes = \[\]: a workload needs at least one request class"),
])
def test_bad_workload_dicts(changes, message):
    with pytest.raises(WorkloadError, match=message):
        workload_from_dict(make_dict(**changes))


def test_missing_required_keys():
    data = make_dict()
    del data["num_requests"]
    with pytest.raises(WorkloadError, match="missing required key 'num_requests'"):
        workload_from_dict(data)
    with pytest.raises(WorkloadError, match="workload = 3: must be a mapping"):
        workload_from_dict(3)


def test_trace_workload_rejects_classes_and_excess_count(tmp_path):
    save_trace(get_workload("quickstart", num_requests=5).generate(), tmp_path / "t.jsonl")
    base = {"arrival": {"trace": "t.jsonl"}}
    with pytest.raises(WorkloadError, match="classes: a trace gives every request's lengths"):
        workload_from_dict(base | {"classes": make_dict()["classes"]}, tmp_path)
    with pytest.raises(WorkloadError, match="num_requests = 6: the trace .* holds only 5"):
        workload_from_dict(base | {"num_requests": 6}, tmp_path)


def test_bad_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError, match=r"workload file .*w\.yaml.*not valid YAML"):
        load_workload(path)
    path.write_text(yaml.safe_dump(make_dict(seed=1.5)))
    with pytest.raises(WorkloadError, match=r"w\.yaml.*seed = 1\.5: must be an integer"):
        load_workload(path)


def test_saved_trace_lines_are_plain_json(tmp_path):
    specs = get_workload("promo-spike", num_requests=3).generate()
    lines = save_trace(specs, tmp_path / "t.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert set(record) == {"arrival_s", "prompt_len", "output_len", "max_tokens", "priority",
                           "tenant", "class"}


def test_a_trace_holding_more_tokens_than_a_workload_may_is_refused_at_its_line(tmp_path):
    # 239 prompts of the longest length hold 250.6 M tokens: the simulator would hold
    # every one of their ids (Mooncake's reader had this cap, ours had not)
    line = json.dumps({"arrival_s": 0, "prompt_len": MAX_LEN - 1, "output_len": 1})
    path = tmp_path / "big.jsonl"
    path.write_text((line + "\n") * 240)
    with pytest.raises(WorkloadError, match=f"line 239: more than {MAX_WORKLOAD_TOKENS:,} "
                                            "prompt and output tokens"):
        load_trace(path)
    path.write_text((line + "\n") * 238)
    assert len(load_trace(path)) == 238
