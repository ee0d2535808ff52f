"""`--pools FILE` on simulate and sweep: the same pools file a server takes makes every
run (every sweep point) that deployment, the result records it, and the incidents' fix
shows: chat's TTFT P99 falls when the long documents get their own pool. A bad file,
or pools on a live sweep, is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from stepserve.cli import main

WORKLOAD = """\
name: chat-and-documents
seed: 3
num_requests: 500
arrival: {poisson: {rate: 12.0}}
classes:
  - {name: chat, share: 0.85, prompt: {uniform: [200, 400]}, output: {uniform: [50, 150]}}
  - {name: document, share: 0.15, prompt: {fixed: 8000}, output: {fixed: 300}}
"""
SHARED = """\
replicas: 3
router: least_outstanding
scheduler: {max_model_len: 16384, max_num_seqs: 64, max_num_batched_tokens: 8192}
"""
POOLS = """\
router: least_outstanding
scheduler: {max_model_len: 16384, max_num_seqs: 64, max_num_batched_tokens: 8192}
pools:
  online: {replicas: 2}
  offline: {replicas: 1, scheduler: {max_num_seqs: 32}}
routing:
  default: online
  rules:
    - {prompt_tokens_over: 4096, pool: offline}
"""
COMMON = ["--cost", "roofline", "--no-progress"]


@pytest.fixture()
def files(tmp_path):
    paths = {}
    for name, text in (("w.yaml", WORKLOAD), ("shared.yaml", SHARED),
                       ("pools.yaml", POOLS)):
        (tmp_path / name).write_text(text)
        paths[name] = str(tmp_path / name)
    paths["dir"] = tmp_path
    return paths


def _simulate(files, pools: str, out: str, capsys) -> dict:
    assert main(["simulate", "--workload", files["w.yaml"], "--pools", files[pools],
                 "--json", out, *COMMON]) == 0
    printed = capsys.readouterr().out
    assert "pools " in printed
    return json.loads(open(out).read())["runs"][0]


def test_simulate_with_pools_records_the_deployment_and_protects_chat(files, capsys):
    shared = _simulate(files, "shared.yaml", str(files["dir"] / "a.json"), capsys)
    pooled = _simulate(files, "pools.yaml", str(files["dir"] / "b.json"), capsys)
    assert shared["deployment"]["pools"] == {"default": 3}
    assert pooled["deployment"] == {
        "router": "least_outstanding", "pools": {"online": 2, "offline": 1},
        "default": "online", "rules": ["prompt tokens > 4096 -> offline"]}
    # the same requests finished either way; chat's tail is what the pools change
    for run in (shared, pooled):
        assert run["summary"]["requests_finished"] == 500
    before = shared["by_class"]["chat"]["ttft_p99_s"]
    after = pooled["by_class"]["chat"]["ttft_p99_s"]
    assert after < before / 2, (before, after)


def test_sweep_applies_the_pools_file_to_every_point(files, capsys):
    out = str(files["dir"] / "sweep.json")
    assert main(["sweep", "--workload", files["w.yaml"], "--pools", files["pools.yaml"],
                 "--vary", "rate=4,8", "--requests", "120", "--quiet", "--json", out,
                 "--cost", "roofline"]) == 0
    points = json.loads(open(out).read())["runs"]
    assert len(points) == 2
    for point in points:
        assert point["deployment"]["pools"] == {"online": 2, "offline": 1}


@pytest.mark.parametrize("text, message", [
    ("pools: {a: {replicas: 0}}\n", "pools.a.replicas = 0"),
    ("pools: {a: {}}\nrouting: {rules: [{pool: b, max_tokens_over: 3}]}\n",
     "routing.rules[0]: needs `pool`"),
    ("routing: {default: a}\n", "rules need `pools`"),
    ("- 1\n", "must be a mapping"),
])
def test_a_bad_pools_file_is_one_line(files, capsys, text, message):
    bad = files["dir"] / "bad.yaml"
    bad.write_text(text)
    assert main(["simulate", "--workload", files["w.yaml"], "--pools", str(bad),
                 *COMMON]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "bad.yaml" in err, err


def test_pools_on_a_live_sweep_are_refused(files, capsys):
    assert main(["sweep", "--workload", files["w.yaml"], "--pools", files["pools.yaml"],
                 "--target", "http://127.0.0.1:9", "--vary", "rate=1,2"]) == 2
    assert "stepserve serve --pools" in capsys.readouterr().err
