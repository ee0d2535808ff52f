"""The kernel cache (ggml_kernels.py): only a folder and library this user alone owns are
loaded, never through a symbolic link; an untrusted or read-only cache means a private
build (one warning), not float weights; the build key follows the compiler's version;
old builds are removed once the current one has loaded.

A planted library here writes a marker file from its constructor: the marker is how a
test sees whether the library was ever loaded into this process."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepserve.model import ggml_kernels
from stepserve.model.ggml_kernels import FMT_Q4_1, kernels_unavailable_reason

pytestmark = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                reason=str(kernels_unavailable_reason()))
LOGGER = "stepserve.model.ggml_kernels"
PLANTED = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def plant(lib: Path, marker: Path) -> None:
    """A library at `lib` whose constructor writes `marker`, checked to do so when loaded
    (in a child process: loading it here is what the tests must show never happens)."""
    source = lib.parent.parent / f"{lib.name}.c"
    source.write_text(PLANTED)
    subprocess.run([ggml_kernels.compiler(), "-shared", "-fPIC", f'-DMARKER="{marker}"',
                    "-o", str(lib), str(source)], check=True)
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r})"],
                   check=True)
    assert marker.read_text() == "ran"
    marker.unlink()


def expected_name() -> str:
    return ggml_kernels.library_name(ggml_kernels.choose_isa())


def assert_kernels_work(kernels: ggml_kernels.GGMLKernels) -> None:
    g = torch.Generator().manual_seed(1)
    qs = torch.randint(0, 256, (24, 32), dtype=torch.uint8, generator=g)
    scales = (torch.rand(24, 2, 2, generator=g) * 0.1).half()
    x = torch.randn(2, 64, generator=g)
    w = kernels.dequantize(FMT_Q4_1, qs, scales, 64, torch.empty(24, 64))
    y = kernels.matmul(FMT_Q4_1, x, qs, scales, torch.empty(2, 24))
    torch.testing.assert_close(y, x @ w.T, rtol=1e-4, atol=1e-4)


def load_privately(cache: Path, caplog, why: str) -> ggml_kernels.GGMLKernels:
    """load_kernels(cache), expected to build in a private folder, warning `why`."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        kernels = ggml_kernels.load_kernels(cache)
    assert kernels.path.parent != cache and not kernels.path.parent.exists()  # removed
    assert why in caplog.text and "private temporary folder" in caplog.text
    assert_kernels_work(kernels)
    return kernels


@pytest.fixture
def cache(tmp_path) -> Path:
    folder = tmp_path / "cache" / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    return folder


def test_a_library_planted_in_a_world_writable_cache_never_runs(cache, tmp_path, caplog):
    marker = tmp_path / "marker"
    plant(cache / expected_name(), marker)
    cache.chmod(0o777)
    load_privately(cache, caplog, "is writable by other users (mode 0o777)")
    assert not marker.exists()
    assert (cache / expected_name()).is_file()  # not ours to remove


@pytest.mark.parametrize("how", ["writable", "owner"])
def test_a_library_not_ours_alone_never_runs(cache, tmp_path, caplog, how):
    marker, lib = tmp_path / "marker", cache / expected_name()
    plant(lib, marker)
    if how == "writable":
        lib.chmod(0o666)
        why = "is writable by other users"
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user takes root")
        os.chown(lib, 65534, 65534)
        why = "belongs to user id 65534"
    load_privately(cache, caplog, why)
    assert not marker.exists()


def test_a_symbolic_link_is_not_followed(cache, tmp_path, caplog):
    """Neither a link in place of the library nor a cache folder that is a link, though
    each points at a library in a folder this user owns."""
    marker, elsewhere = tmp_path / "marker", tmp_path / "elsewhere" / "kernels"
    elsewhere.mkdir(parents=True, mode=0o700)
    plant(elsewhere / expected_name(), marker)
    (cache / expected_name()).symlink_to(elsewhere / expected_name())
    load_privately(cache, caplog, "is a symbolic link")
    link = tmp_path / "linked-cache"
    link.symlink_to(elsewhere, target_is_directory=True)
    load_privately(link, caplog, "is a symbolic link or not a folder")
    assert not marker.exists()


def writes_anyway(folder: Path) -> bool:
    """Whether this process can still create files in `folder` despite its mode (root
    can: it ignores permission bits)."""
    probe = folder / ".probe"
    try:
        probe.touch()
    except PermissionError:
        return False
    probe.unlink()
    return True


def test_a_read_only_cache_builds_privately(cache, caplog, monkeypatch):
    cache.chmod(0o555)
    if writes_anyway(cache):
        # Root ignores the mode, and a flag root does respect (chattr +i) needs a
        # capability and a filesystem that CI does not promise; so the one write into the
        # folder (ggml_kernels._temp_file) fails as the OS would fail it without root.
        temp_file = ggml_kernels._temp_file

        def refuse(folder: Path) -> tuple[int, str]:
            if folder != cache:
                return temp_file(folder)
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))

        monkeypatch.setattr(ggml_kernels, "_temp_file", refuse)
    load_privately(cache, caplog, "is not writable (Permission denied)")
    assert not os.listdir(cache)


def test_a_read_only_cache_with_the_library_in_it_is_used(cache, caplog):
    built = ggml_kernels.load_kernels(cache).path
    cache.chmod(0o555)
    ggml_kernels._load.cache_clear()  # a new process
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ggml_kernels.load_kernels(cache).path == built
    assert "private" not in caplog.text


def test_the_build_key_follows_the_compilers_version(tmp_path, monkeypatch):
    cc = tmp_path / "cc"
    real = ggml_kernels.compiler()

    def name_with(version: str) -> str:
        cc.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{version}"; exit 0; }}\n'
                      f'exec {real} "$@"\n')
        cc.chmod(0o755)
        ggml_kernels.compiler_version.cache_clear()
        return ggml_kernels.library_name("avx2")

    monkeypatch.setenv("CC", str(cc))
    names = {name_with("cc 12.2.0"), name_with("cc 13.1.0")}
    monkeypatch.delenv("CC")
    ggml_kernels.compiler_version.cache_clear()
    names.add(ggml_kernels.library_name("avx2"))
    assert len(names) == 3


def test_old_builds_are_removed_once_the_current_one_loads(cache):
    other_isa = next(isa for isa in ggml_kernels.ISAS if isa != ggml_kernels.choose_isa())
    others = ["ggml_kernels-avx2-notes.txt", "ggml_kernels-avx2-0123.so", "other.so",
              ggml_kernels.library_name(other_isa)]  # another build's current library stays
    # an old key, and a build for an instruction set no longer built
    old = [f"ggml_kernels-avx2-{'0' * 16}.so", f"ggml_kernels-avx512_vnni-{'a' * 16}.so"]
    for name in others + old:
        (cache / name).write_bytes(b"not a library")
    kernels = ggml_kernels.load_kernels(cache)
    assert sorted(os.listdir(cache)) == sorted([kernels.path.name, *others])


def test_no_old_build_is_removed_from_a_cache_not_ours_alone(cache, tmp_path, caplog):
    old = cache / f"ggml_kernels-avx2-{'0' * 16}.so"
    old.write_bytes(b"someone else's")
    cache.chmod(0o777)
    load_privately(cache, caplog, "writable by other users")
    assert old.exists()
