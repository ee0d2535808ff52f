import argparse
import json

import pytest

from stepserve.cli.plan import add_plan_parser


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="stepserve")
    add_plan_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def groups(*texts):
    return [arg for text in texts for arg in ("--group", text)]


@pytest.mark.parametrize(
    ("argv", "util", "cap", "ideal"),
    [
        (groups("10x2000", "54x20") + ["--concurrency", "64"], 0.164688, 6.072, 329.375),
        (groups("9x20", "1x2000") + ["--concurrency", "10"], 0.109, 9.174, 218.0),
        (groups("1x20", "1x50", "1x30", "1x200") + ["--concurrency", "4"], 0.375, 2.667, 75.0),
    ],
)
def test_speedup_json_seed_examples(argv, util, cap, ideal, capsys):
    code, out, err = run(["speedup", *argv, "--json"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["slot_utilization"] == pytest.approx(util, abs=1e-6)
    assert data["speedup_cap"] == pytest.approx(cap, abs=1e-3)
    assert data["ideal_steps"] == pytest.approx(ideal)
    assert isinstance(data["static_steps"], int)


def test_speedup_table_explains_each_number(capsys):
    code, out, _ = run(["speedup", *groups("10x2000", "54x20"), "--concurrency", "64"], capsys)
    assert code == 0
    assert "16.5%" in out and "6.07x" in out and "329.4" in out
    assert "21,080 useful / (64 slots x 2,000 static steps)" in out
    assert "below 50%" in out


def test_speedup_table_shows_batches(capsys):
    code, out, _ = run(["speedup", *groups("10x2000", "54x20"), "--concurrency", "8"], capsys)
    assert code == 0
    assert "filled in the order given" in out
    assert "2-7" in out


@pytest.mark.parametrize("bad", ["10y2000", "10x", "0x20"])
def test_speedup_bad_group(bad, capsys):
    code, out, err = run(["speedup", "--group", bad, "--concurrency", "4"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and repr(bad) in err and "COUNTxLENGTH" in err


def test_speedup_bad_concurrency(capsys):
    code, _, err = run(["speedup", "--group", "1x10", "--concurrency", "0"], capsys)
    assert code == 2 and "concurrency" in err


SEED_CAPACITY = [
    "--kv-memory",
    "38GB",
    "--max-len",
    "4096",
    "--headroom",
    "0.15",
    "--peak-concurrency",
    "140",
]


@pytest.mark.parametrize(
    "per_token", [["--kv-bytes-per-token", "192KiB"], ["--model-spec", "qwen2.5-14b"]]
)
def test_capacity_json_seed(per_token, capsys):
    code, out, err = run(["capacity", *SEED_CAPACITY, *per_token, "--json"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["kv_bytes_per_token"] == 196_608
    assert (data["seqs_per_replica"], data["max_num_seqs"], data["replicas"]) == (47, 40, 3)


def test_capacity_table(capsys):
    code, out, _ = run(["capacity", *SEED_CAPACITY, "--kv-bytes-per-token", "192KiB"], capsys)
    assert code == 0
    assert "floor(47.19 x 0.85) = floor(40.11)" in out
    assert "ceil(140 peak / 47 seqs per replica)" in out


def test_capacity_model_spec_derives_per_token(capsys):
    code, out, _ = run(["capacity", *SEED_CAPACITY, "--model-spec", "llama-3-8b", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["kv_bytes_per_token"] == 131_072 and data["model_spec"] == "llama-3-8b"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--kv-bytes-per-token", "192K"], "'192K'"),
        (["--model-spec", "gpt-5"], "unknown model spec"),
        (["--kv-bytes-per-token", "192KiB", "--headroom", "1"], "headroom"),
    ],
)
def test_capacity_errors(extra, needle, capsys):
    code, out, err = run(["capacity", *SEED_CAPACITY, *extra], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in err


@pytest.mark.parametrize(
    "per_token", [[], ["--kv-bytes-per-token", "192KiB", "--model-spec", "llama-3-8b"]]
)
def test_capacity_needs_exactly_one_per_token_source(per_token, capsys):
    with pytest.raises(SystemExit) as info:
        run(["capacity", *SEED_CAPACITY, *per_token], capsys)
    assert info.value.code == 2


def test_models(capsys):
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "smollm2-135m" in out and "192 KiB" in out
    code, out, _ = run(["models", "--json"], capsys)
    rows = json.loads(out)
    assert {"name": "llama-3-8b", "kv_bytes_per_token": 131_072}.items() <= next(
        r for r in rows if r["name"] == "llama-3-8b"
    ).items()
