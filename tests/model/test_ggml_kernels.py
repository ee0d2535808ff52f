"""Building the GGUF kernels on a fresh machine, and the clean fallback where they cannot
run: the reason reaches the user, "auto" loads float weights, an explicit q4_1 refuses."""

from __future__ import annotations

import os
import stat

import pytest

from stepserve.model import ggml_kernels
from stepserve.model.ggml_kernels import KernelsUnavailable, kernels_unavailable_reason
from stepserve.model.runner import TorchRunner

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                   reason=str(kernels_unavailable_reason()))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory: the kernels are built (or fail) anew."""
    monkeypatch.setenv("STEPSERVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@needs_kernels
def test_builds_into_an_empty_cache_once(fresh_cache):
    kernels = ggml_kernels.load_kernels()
    assert kernels.path.parent == fresh_cache / "kernels" and kernels.path.is_file()
    built = kernels.path.stat().st_mtime_ns
    ggml_kernels._load.cache_clear()  # a new process: the library is reused, not rebuilt
    assert ggml_kernels.load_kernels().path.stat().st_mtime_ns == built


def test_no_compiler_falls_back_with_the_reason(fresh_cache, tmp_path, monkeypatch,
                                                gguf_dir):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    reason = kernels_unavailable_reason()
    assert reason is not None and "no C compiler" in reason
    runner = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=8)
    assert runner.quantization == "none"
    assert "no C compiler" in runner.describe()
    with pytest.raises(ValueError, match="no C compiler"):
        TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=8, quantization="q4_1")


def test_a_failing_compiler_is_reported_and_tried_once(fresh_cache, tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    cc = tmp_path / "broken-cc"
    cc.write_text(f"#!/bin/sh\necho \"$1\" >> {calls}\necho 'cc: error: no AVX2 here' >&2\n"
                  "exit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))
    for _ in range(3):
        with pytest.raises(KernelsUnavailable, match="no AVX2 here"):
            ggml_kernels.load_kernels()
    # Its version asked once (the build key), one build tried.
    assert calls.read_text().split() == ["--version", ggml_kernels.CFLAGS[0]]
    assert not [p for p in os.listdir(fresh_cache / "kernels")]  # no half-built library


def test_a_cpu_without_avx2_is_named(fresh_cache, monkeypatch):
    monkeypatch.setattr(ggml_kernels, "_cpu_flags", lambda: {"sse2", "fma"})
    monkeypatch.setattr(ggml_kernels.platform, "machine", lambda: "x86_64")
    assert kernels_unavailable_reason() == ("the GGUF kernels need AVX2, FMA and F16C; this "
                                            "CPU lacks avx2, f16c")
    monkeypatch.setattr(ggml_kernels.platform, "machine", lambda: "aarch64")
    ggml_kernels._load.cache_clear()
    assert "x86-64" in kernels_unavailable_reason()


def test_the_instruction_set_is_chosen_and_checked(monkeypatch):
    avx512 = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    monkeypatch.delenv(ggml_kernels.ISA_ENV, raising=False)
    monkeypatch.setattr(ggml_kernels, "_cpu_flags", lambda: avx512)
    assert ggml_kernels.choose_isa() == "avx512"
    assert ggml_kernels.available_isas() == ["avx2", "avx512"]
    monkeypatch.setenv(ggml_kernels.ISA_ENV, "avx2")
    assert ggml_kernels.choose_isa() == "avx2"
    monkeypatch.setattr(ggml_kernels, "_cpu_flags", lambda: {"avx2", "fma", "f16c", "avx512f"})
    monkeypatch.delenv(ggml_kernels.ISA_ENV)
    assert ggml_kernels.choose_isa() == "avx2"
    with pytest.raises(KernelsUnavailable, match="lacks: avx512bw, avx512vl, avx512dq"):
        ggml_kernels.choose_isa("avx512")
    with pytest.raises(KernelsUnavailable, match="must be one of avx2, avx512"):
        ggml_kernels.choose_isa("sse")


@needs_kernels
@pytest.mark.parametrize("isa", ggml_kernels.available_isas())
def test_each_build_has_its_own_library(fresh_cache, isa):
    kernels = ggml_kernels.load_kernels(isa=isa)
    assert kernels.isa == isa and kernels.path.name.startswith(f"ggml_kernels-{isa}-")
