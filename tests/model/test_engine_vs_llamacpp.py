"""benchmarks/engine_vs_llamacpp.py's harness: without a llama-server binary it says so
and exits 2; with one (here a stand-in that serves the tiny model through `stepserve
serve`, since the real binary is not built on CI) it runs both servers one after the
other under the same loads and reports every cell and ratio."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "engine_vs_llamacpp.py"


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=900, env=env)


def test_without_the_binary_it_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}
    result = run([], env)
    assert result.returncode == 2
    assert "no llama-server binary" in result.stderr and "builds nothing" in result.stderr
    result = run(["--llama-server", str(tmp_path / "missing")])
    assert result.returncode == 2 and "not an executable file" in result.stderr


@pytest.mark.slow
def test_both_servers_run_the_same_loads(tmp_path, tiny_dir, gguf_dir):
    fake = tmp_path / "llama-server"
    # llama-server's flags, answered by `stepserve serve` on the tiny model
    fake.write_text(f"""#!{sys.executable}
import sys
argv = sys.argv[1:]
port = argv[argv.index("--port") + 1]
assert "--parallel" in argv and "--ctx-size" in argv and "-m" in argv
sys.argv = ["stepserve", "serve", "--model", "{tiny_dir}", "--port", port]
from stepserve.cli import main
sys.exit(main())
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out.json"
    result = run(["--llama-server", str(fake), "--gguf", str(gguf_dir.parent / "tiny.gguf"),
                  "--model", str(gguf_dir), "--concurrency", "1,4", "--num-prompts", "4",
                  "--input-len", "8", "--output-len", "4", "--night-requests", "6",
                  "--port", "18123", "--json", str(out)])
    assert result.returncode == 0, result.stdout + result.stderr
    cells = json.loads(out.read_text())["cells"]
    assert [(c["server"], c["load"]) for c in cells] == [
        (s, load) for s in ("llama.cpp", "stepserve") for load in ("c=1", "c=4", "night-report")]
    assert all(c["summary"]["throughput_tokens_per_s"] > 0 for c in cells)
    assert result.stdout.count("ratio") >= 3


def test_every_load_sends_prompts_of_its_own_seed(tmp_path):
    """llama-server serves a prompt it has seen from a slot's cache: loads that shared a
    seed would send it the same prompts again (request i of each load), and it would be
    timed on cache hits against stepserve's full prefills."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_vs_llamacpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    args = argparse.Namespace(concurrency=[1, 8, 32], input_len=128, output_len=64,
                              num_prompts=96, night_requests=192)
    todo = module.loads(args, tmp_path)
    seeds = [load.bench_args[load.bench_args.index("--seed") + 1] for load in todo]
    assert [load.name for load in todo] == ["c=1", "c=8", "c=32", "night-report"]
    assert len(set(seeds)) == len(todo)
    night = json.loads((tmp_path / "night.yaml").read_text())
    assert str(night["seed"]) == seeds[-1]
