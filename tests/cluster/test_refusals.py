"""Replicas are never silently dropped: `serve --replicas 2` without the cluster extra is
one line naming the install command (exit 2, before any model loads); `LLM(replicas=2)`
and `bench --engine --replicas 2` refuse with one clear error; a bad pools file is one
line too."""

from __future__ import annotations

import socket
import sys

import pytest

from stepserve.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def no_ray(monkeypatch):
    """Ray not installed: importing it fails as it would (None in sys.modules)."""
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr("stepserve.model.presets.resolve_model", no_model)


@pytest.mark.parametrize("extra", [["--replicas", "2"], ["--pools", "pools.yaml"],
                                   ["--ray-address", "127.0.0.1:6379"]])
def test_serve_on_a_cluster_without_the_extra_names_the_install_command(no_ray, extra,
                                                                        capsys):
    code = main(["serve", "--model", "tiny", "--port", str(free_port()), *extra])
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert "pip install -e '.[cluster]'" in line and "Ray Serve" in line


def test_one_replica_without_the_extra_is_the_single_process_server(no_ray):
    from stepserve.cli.serve import ServeOptions, on_cluster

    assert not on_cluster(ServeOptions(model="tiny"))


def test_llm_refuses_replicas():
    from stepserve import LLM

    with pytest.raises(ValueError, match=r"replicas = 3: .*stepserve serve --replicas 3"):
        LLM("tiny", replicas=3)


def test_bench_engine_refuses_replicas(capsys):
    code = main(["bench", "--engine", "--replicas", "2", "--num-prompts", "2",
                 "--random-input-len", "4", "--random-output-len", "2", "--no-progress"])
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert "--replicas 2" in line and "--target" in line


def test_a_bad_pools_file_is_one_line(tmp_path, capsys):
    pytest.importorskip("ray.serve")
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools: {online: {replicas: 0}}\n")
    code = main(["serve", "--model", "tiny", "--port", str(free_port()), "--pools",
                 str(pools)])
    line = one_line(capsys.readouterr().err)
    assert code == 2
    assert "pools.online.replicas = 0" in line and str(pools) in line
