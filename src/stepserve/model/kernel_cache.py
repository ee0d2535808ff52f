"""The kernel library built into the cache folder, and opened only if it is ours.

A library found under the expected name runs its constructors the moment it is loaded,
before any self-test can judge it, so a cache folder another user can write to would let
them run code in our process. `load_library` trusts a folder and a library only where
this user owns them and neither group nor others may write them; both are opened without
following symbolic links (O_NOFOLLOW), checked on the open descriptors (fstat), and the
library is loaded through its checked descriptor (/proc/self/fd/N), so what was checked
is what runs. Where the cache is not trusted, or cannot be written (a read-only folder),
the library is built in a private temporary folder (mkdtemp, mode 0700) instead, with one
warning saying why; the caller gets working kernels either way.

In the cache folder, a build is `ggml_kernels-<isa>-<key>.so`, the key a hash of the
sources, the headers, the compiler, its flags and its `--version` output (an edit, other
flags or a compiler upgrade make a new build). Once the current build has loaded,
`remove_old_builds` removes the other files of that pattern.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from stepserve.model.kernel_abi import KernelsUnavailable

_HERE = Path(__file__).parent
# decode_kernels.c (the fused decode step, fused_decode.py) calls ggml_matmul_team: one
# library.
SOURCES = tuple(_HERE / n for n in ("ggml_kernels.c", "decode_kernels.c", "decode_attention.c",
                                    "kernel_abi.c"))
HEADERS = tuple(_HERE / n for n in ("ggml_groups.h", "ggml_panels.h", "ggml_team.h",
                                    "paged_attend.h", "kernel_abi.h"))  # in the key, not compiled
# -ffp-contract=off: no FMA where the C source writes a product and a sum (torch rounds
# both); the explicit fmadd intrinsics stay FMAs.
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-shared",
          "-fPIC", "-std=gnu11")
# Each instruction set the library is built for: its extra flags and the CPU flags it needs.
ISAS = {"avx2": ((), ()),
        "avx512": (("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mprefer-vector-width=512"), ("avx512f", "avx512bw", "avx512vl", "avx512dq"))}
LIBRARY_NAME = re.compile(r"ggml_kernels-[a-z0-9_]+-[0-9a-f]{16}\.so")
_BUILD_TIMEOUT_S = 120  # a build takes a few seconds on two cores
_OPEN_LIBRARY = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

logger = logging.getLogger(__name__)


class Untrusted(Exception):
    """Why the cache folder, or a library in it, is not used (the message says)."""


@dataclass(frozen=True)
class Library:
    """A loaded kernel library: where it was built (a private build's folder is removed
    once loaded) and the cache folder it came from (None: a private build)."""

    lib: ctypes.CDLL
    path: Path
    cache_dir: Path | None


def compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelsUnavailable("the GGUF kernels are built on first use and no C compiler "
                             "was found (install gcc, or set CC)")


@cache
def compiler_version(cc: str) -> str:
    """What `cc --version` says (its exit status too): part of the build key."""
    try:
        result = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelsUnavailable(f"`{cc} --version` failed: {e}") from e
    return f"{result.stdout}{result.stderr}{result.returncode}"


def library_name(isa: str) -> str:
    """The current build's file name for `isa` (a key of ISAS)."""
    cc = compiler()
    digest = hashlib.sha256()
    for part in (*SOURCES, *HEADERS):
        digest.update(part.read_bytes())
    digest.update(" ".join((cc, *CFLAGS, *ISAS[isa][0])).encode())
    digest.update(compiler_version(cc).encode())
    return f"ggml_kernels-{isa}-{digest.hexdigest()[:16]}.so"


def _check_owner(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise Untrusted(f"{what} belongs to user id {st.st_uid}, not to this user "
                        f"({os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Untrusted(f"{what} is writable by other users (mode "
                        f"{oct(stat.S_IMODE(st.st_mode))})")


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, checked: not a symbolic link, ours alone."""
    what = f"the kernel cache {folder}"
    try:
        fd = os.open(folder, _OPEN_FOLDER)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Untrusted(f"{what} is a symbolic link or not a folder") from e
        raise Untrusted(f"{what} cannot be opened ({e.strerror})") from e
    try:
        _check_owner(os.fstat(fd), what)
    except Untrusted:
        os.close(fd)
        raise
    return fd


def _open_library(folder_fd: int, name: str, path: Path) -> int | None:
    """A descriptor of the library `name` in the checked folder (None: there is none),
    checked: a regular file, not a symbolic link, ours alone."""
    what = f"the kernel library {path}"
    try:
        fd = os.open(name, _OPEN_LIBRARY, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Untrusted(f"{what} is a symbolic link") from e
        raise Untrusted(f"{what} cannot be opened ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{what} is not a regular file")
        _check_owner(st, what)
    except Untrusted:
        os.close(fd)
        raise
    return fd


def _dlopen(fd: int, path: Path) -> ctypes.CDLL:
    """Load the library open at `fd`: through /proc/self/fd, the very file checked. That
    descriptor stays open for the process's life: the dynamic loader knows the library by
    that path, and a reused number would make it hand back this library for another."""
    by_fd = f"/proc/self/fd/{fd}"
    target = by_fd if os.path.exists(by_fd) else str(path)
    try:
        lib = ctypes.CDLL(target)
    except OSError as e:
        os.close(fd)
        raise KernelsUnavailable(f"the kernel library {path} could not be loaded: {e}") from e
    if target != by_fd:
        os.close(fd)
    return lib


def _temp_file(folder: Path) -> tuple[int, str]:
    """A new file in `folder` for the compiler's output (the only write into the folder)."""
    return tempfile.mkstemp(prefix=".ggml_kernels-", suffix=".tmp", dir=folder)


def _build(folder: Path, name: str, isa: str) -> None:
    """Compile the library into `folder` as `name` (atomically: a concurrent build's copy
    is as good as ours). Untrusted where the folder cannot be written."""
    cc = compiler()
    try:
        fd, tmp = _temp_file(folder)
    except OSError as e:
        raise Untrusted(f"the kernel cache {folder} is not writable ({e.strerror})") from e
    os.close(fd)
    try:
        result = subprocess.run([cc, *CFLAGS, *ISAS[isa][0], "-o", tmp, *map(str, SOURCES)],
                                capture_output=True, text=True, errors="replace",
                                timeout=_BUILD_TIMEOUT_S)
        if result.returncode != 0:
            raise KernelsUnavailable(f"building the GGUF kernels with {cc} failed: "
                                     f"{result.stderr.strip()[-500:]}")
        # The linker's mode follows the umask; a group-writable one would leave a library
        # this loader then refuses.
        os.chmod(tmp, 0o755)
        os.replace(tmp, folder / name)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_from(folder: Path, name: str, isa: str) -> tuple[ctypes.CDLL, Path]:
    """The library `name` in the trusted `folder`, built there first if it is missing."""
    folder_fd = _open_folder(folder)
    try:
        fd = _open_library(folder_fd, name, folder / name)
        if fd is None:
            _build(folder, name, isa)
            fd = _open_library(folder_fd, name, folder / name)
        if fd is None:
            raise KernelsUnavailable(f"the kernel library {folder / name} vanished after "
                                     "its build")
        return _dlopen(fd, folder / name), folder / name
    finally:
        os.close(folder_fd)


@cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def load_library(cache_dir: Path, isa: str) -> Library:
    """The current `isa` build from `cache_dir` (built there on first use), or, where that
    folder or the library in it is not trusted or the folder cannot be written, from a
    private temporary folder (warned about once)."""
    name = library_name(isa)
    try:
        try:
            # 0700: a group-writable umask must not leave a folder this loader refuses.
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise Untrusted(f"the kernel cache {cache_dir} cannot be created "
                            f"({e.strerror})") from e
        lib, path = _load_from(cache_dir, name, isa)
        return Library(lib, path, cache_dir)
    except Untrusted as why:
        _warn_once(f"{why}: building the GGUF kernels in a private temporary folder "
                   "instead (every process builds its own until that is fixed)")
    lib, path = _private_build(name, isa)
    return Library(lib, path, None)


@cache
def _private_build(name: str, isa: str) -> tuple[ctypes.CDLL, Path]:
    """The library built in a folder of its own (mkdtemp: 0700), once per process; the
    folder is removed once the library is loaded (the mapping outlives the file)."""
    private = Path(tempfile.mkdtemp(prefix="stepserve-kernels-"))
    try:
        return _load_from(private, name, isa)
    except Untrusted as why:
        raise KernelsUnavailable(f"the GGUF kernels could not be built: {why}") from why
    finally:
        shutil.rmtree(private, ignore_errors=True)


def remove_old_builds(cache_dir: Path) -> list[str]:
    """Remove our other builds in `cache_dir` (files named as a build whose name is no
    ISA's current one); the names removed. Nothing where the folder is not trusted."""
    current = {library_name(isa) for isa in ISAS}
    try:
        folder_fd = _open_folder(cache_dir)
    except Untrusted:
        return []
    removed = []
    try:
        for name in os.listdir(folder_fd):
            if LIBRARY_NAME.fullmatch(name) and name not in current:
                try:
                    os.unlink(name, dir_fd=folder_fd)
                    removed.append(name)
                except OSError:  # a read-only folder, or another process was first
                    pass
    finally:
        os.close(folder_fd)
    return removed
