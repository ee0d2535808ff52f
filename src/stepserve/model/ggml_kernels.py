"""The GGUF matrix kernels (ggml_kernels.c and the C files beside it), built once with the
system C compiler into the cache folder, loaded with ctypes, and checked against
kernel_abi.h and against torch; `load_kernels()` raises `KernelsUnavailable` with the
reason where that fails. Our own because torch's CPU weight-only kernels do not fit Q4_1:
`_weight_int4pack_mm_for_cpu` vectorises only bfloat16 (its float32 path is ~10x slower
than a float32 GEMM) and `_weight_int8pack_mm` holds one scale per row, not per group.

Trust: a library's constructors run when it loads, so the cache folder and the library are
opened without following links, checked on the open descriptors (this user's, writable by
no one else) and loaded through that descriptor (/proc/self/fd/N); an untrusted cache means
a private build in a temporary folder. Every tensor passes `tensor_pointer` before its
pointer crosses: a wrong dtype, device, stride or size would give garbage or a crash.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).parent
HEADER = _HERE / "kernel_abi.h"
VERSION_NAME = "STEPSERVE_ABI_VERSION"
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
ISA_ENV = "STEPSERVE_KERNEL_ISA"  # a key of ISAS: which build to load (default: the widest)
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
LIBRARY_NAME = re.compile(r"ggml_kernels-[a-z0-9_]+-[0-9a-f]{16}\.so")
_BUILD_TIMEOUT_S = 120  # a build takes a few seconds on two cores
_OPEN_LIBRARY = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The struct fields Python fills, by name; their order and offsets are the library's.
DIMS_FIELDS = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "num_blocks",
               "block_size", "window")
PROJECTIONS = ("qkv", "o", "gate_up", "down")
LAYER_FIELDS = ("input_norm", "post_norm",
                *(f"{p}.{f}" for p in PROJECTIONS for f in ("format", "qs", "scales")))
_WORD = 8  # every struct field is an int64
GROUP = 32  # weights per GGUF group: K is a multiple of it

logger = logging.getLogger(__name__)


class KernelsUnavailable(RuntimeError):
    """The GGUF kernels cannot run here (the message says why)."""


class KernelArgumentError(ValueError):
    """A tensor a kernel cannot read as it is."""


class Untrusted(Exception):
    """Why the cache folder, or a library in it, is not used (the message says)."""


def _header_constants() -> dict[str, int]:
    text = HEADER.read_text()
    found = {m[1]: int(m[2]) for m in re.finditer(r"^\s*([A-Z][A-Z0-9_]*) = (-?\d+),",
                                                   text, re.MULTILINE)}
    version = re.search(rf"^#define {VERSION_NAME} (\d+)$", text, re.MULTILINE)
    if version is None or not found:
        raise RuntimeError(f"{HEADER} lost its {VERSION_NAME} or its enums")
    return {VERSION_NAME: int(version[1]), **found}


_HEADER = _header_constants()
ABI_VERSION = _HEADER[VERSION_NAME]
FMT_Q4_1, FMT_Q8_0 = _HEADER["FMT_Q4_1"], _HEADER["FMT_Q8_0"]
FMT_F32 = _HEADER["FMT_F32"]
KERNEL_OK, KERNEL_OUT_OF_MEMORY = _HEADER["KERNEL_OK"], _HEADER["KERNEL_OUT_OF_MEMORY"]
# Per format: the quants' dtype, quant bytes and scales per group (ggml_groups.h's layout).
_WEIGHTS = {FMT_Q4_1: (torch.uint8, 16, 2), FMT_Q8_0: (torch.int8, 32, 1)}


# ---- the interface: struct layouts and tensors crossing to C ----

@dataclass(frozen=True)
class StructLayout:
    """A struct of int64 fields as the library lays it out: `size` words, each field's index."""

    name: str
    size: int
    fields: dict[str, int]

    def words(self, **values: int) -> list[int]:
        out = [0] * self.size
        for name, index in self.fields.items():
            out[index] = values[name]
        return out


@dataclass(frozen=True)
class KernelLayout:
    dims: StructLayout
    layer: StructLayout


def _struct(entries: dict[str, int], name: str, wanted: tuple[str, ...],
            where: str) -> StructLayout:
    prefix = name + "."
    offsets = {k[len(prefix):]: v for k, v in entries.items() if k.startswith(prefix)}
    missing = [f for f in wanted if f not in offsets]
    extra = sorted(set(offsets) - set(wanted))
    size = entries.get(name, -1)
    if missing or extra:
        raise KernelsUnavailable(
            f"the kernel library {where} lays out struct {name} differently: "
            + "; ".join(filter(None, (missing and f"no field {', '.join(missing)}",
                                      extra and f"fields Python does not fill: "
                                                f"{', '.join(extra)}"))))
    indices = sorted(offsets.values())
    if size != _WORD * len(wanted) or indices != list(range(0, size, _WORD)):
        raise KernelsUnavailable(
            f"the kernel library {where} lays out struct {name} in {size} bytes at offsets "
            f"{indices}; Python fills {len(wanted)} int64 fields")
    return StructLayout(name, size // _WORD, {f: offsets[f] // _WORD for f in wanted})


def read_layout(lib: ctypes.CDLL, where: str) -> KernelLayout:
    """The layout the library loaded from `where` exports, checked against kernel_abi.h."""
    try:
        entry = lib.stepserve_abi_entry
    except AttributeError:
        raise KernelsUnavailable(f"the kernel library {where} exports no layout "
                                 "(stepserve_abi_entry): not built from these sources") from None
    entry.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p),
                      ctypes.POINTER(ctypes.c_int64)]
    entry.restype = ctypes.c_int
    name, value, entries = ctypes.c_char_p(), ctypes.c_int64(), {}
    while entry(len(entries), ctypes.byref(name), ctypes.byref(value)):
        entries[(name.value or b"").decode()] = value.value
    version = entries.get(VERSION_NAME)
    if version != ABI_VERSION:
        raise KernelsUnavailable(f"the kernel library {where} has ABI version {version}; "
                                 f"this stepserve reads version {ABI_VERSION} (remove the "
                                 "library to rebuild it)")
    differ = [f"{k} = {entries.get(k)} (expected {v})" for k, v in _HEADER.items()
              if entries.get(k) != v]
    if differ:
        raise KernelsUnavailable(f"the kernel library {where} disagrees with kernel_abi.h: "
                                 + ", ".join(differ))
    return KernelLayout(_struct(entries, "decode_dims", DIMS_FIELDS, where),
                        _struct(entries, "decode_layer", LAYER_FIELDS, where))


Shape = tuple[int | None, ...]  # None: any size in that dimension


def _wanted(dtype: torch.dtype, shape: Shape | None, ndim: int | None, numel: int | None,
            at_least: int | None) -> str:
    dims = None if shape is None else ", ".join("*" if s is None else str(s) for s in shape)
    parts = [f"a contiguous {str(dtype).removeprefix('torch.')} CPU tensor"]
    for value, text in ((ndim, f"{ndim} dimensions"), (dims, f"shape [{dims}]"),
                        (numel, f"{numel} elements"), (at_least, f"at least {at_least} elements")):
        if value is not None:
            parts.append(text)
    return " of ".join(parts)


def _got(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    layout = "" if t.is_contiguous() else "non-contiguous "
    return (f"a {layout}{str(t.dtype).removeprefix('torch.')} tensor of shape "
            f"{list(t.shape)} on {t.device}")


def tensor_pointer(what: str, t: torch.Tensor, dtype: torch.dtype, shape: Shape | None = None,
                   *, ndim: int | None = None, numel: int | None = None,
                   at_least: int | None = None) -> int:
    """t's data pointer, once it is a contiguous CPU tensor of `dtype` and the given shape
    (None: any size there), dimensions, element count or minimum element count."""
    if (not isinstance(t, torch.Tensor) or t.dtype is not dtype or not t.is_cpu
            or not t.is_contiguous()
            or (shape is not None and t.shape != shape  # else compare with the wildcards
                and not (len(t.shape) == len(shape)
                         and all(w is None or g == w for g, w in zip(t.shape, shape))))
            or (ndim is not None and t.dim() != ndim)
            or (numel is not None and t.numel() != numel)
            or (at_least is not None and t.numel() < at_least)):
        wanted = _wanted(dtype, shape, ndim, numel, at_least)
        raise KernelArgumentError(f"{what} must be {wanted}; got {_got(t)}")
    return t.data_ptr()


# ---- building into the cache, and opening only our own ----

def compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelsUnavailable("the GGUF kernels are built on first use and no C compiler "
                             "was found (install gcc, or set CC)")


@cache
def compiler_version(cc: str) -> str:
    try:
        result = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelsUnavailable(f"`{cc} --version` failed: {e}") from e
    return f"{result.stdout}{result.stderr}{result.returncode}"


def library_name(isa: str) -> str:
    """The build's name: a hash of the sources, compiler, flags and `--version`."""
    cc = compiler()
    digest = hashlib.sha256()
    for part in (*SOURCES, *HEADERS):
        digest.update(part.read_bytes())
    digest.update(" ".join((cc, *CFLAGS, *ISAS[isa][0])).encode())
    digest.update(compiler_version(cc).encode())
    return f"ggml_kernels-{isa}-{digest.hexdigest()[:16]}.so"


def _open_checked(what: str, path: Path | str, flags: int, dir_fd: int | None = None) -> int:
    """A descriptor of the folder, or (with `dir_fd`) of the library in it, checked: no
    symbolic link, a folder or regular file, this user's alone (FileNotFoundError: none)."""
    folder = dir_fd is None
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if not folder and e.errno == errno.ENOENT:
            raise
        if e.errno == errno.ELOOP or (folder and e.errno == errno.ENOTDIR):
            kind = "a symbolic link or not a folder" if folder else "a symbolic link"
            raise Untrusted(f"{what} is {kind}") from e
        raise Untrusted(f"{what} cannot be opened ({e.strerror})") from e
    st = os.fstat(fd)
    if not folder and not stat.S_ISREG(st.st_mode):
        why = f"{what} is not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"{what} belongs to user id {st.st_uid}, not to this user ({os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"{what} is writable by other users (mode {oct(stat.S_IMODE(st.st_mode))})"
    else:
        return fd
    os.close(fd)
    raise Untrusted(why)


def _dlopen(fd: int, path: Path) -> ctypes.CDLL:
    """Load the library open at `fd` through /proc/self/fd, the very file checked; the
    descriptor stays open (a reused number would make the loader return this library)."""
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
    """Compile the library into `folder` as `name`, atomically (Untrusted: not writable)."""
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
        os.chmod(tmp, 0o755)
        os.replace(tmp, folder / name)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_from(folder: Path, name: str, isa: str) -> tuple[ctypes.CDLL, Path]:
    path, what = folder / name, f"the kernel library {folder / name}"
    folder_fd = _open_checked(f"the kernel cache {folder}", folder, _OPEN_FOLDER)
    try:
        try:
            fd = _open_checked(what, name, _OPEN_LIBRARY, folder_fd)
        except FileNotFoundError:
            _build(folder, name, isa)
            try:
                fd = _open_checked(what, name, _OPEN_LIBRARY, folder_fd)
            except FileNotFoundError:
                raise KernelsUnavailable(f"{what} vanished after its build") from None
        return _dlopen(fd, path), path
    finally:
        os.close(folder_fd)


@cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def load_library(cache_dir: Path, isa: str) -> tuple[ctypes.CDLL, Path]:
    """The `isa` build from `cache_dir` (built on first use), else, where that is not
    trusted or writable, from a private temporary folder (warned about once)."""
    name = library_name(isa)
    try:
        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise Untrusted(f"the kernel cache {cache_dir} cannot be created "
                            f"({e.strerror})") from e
        return _load_from(cache_dir, name, isa)
    except Untrusted as why:
        _warn_once(f"{why}: building the GGUF kernels in a private temporary folder "
                   "instead (every process builds its own until that is fixed)")
    return _private_build(name, isa)


@cache
def _private_build(name: str, isa: str) -> tuple[ctypes.CDLL, Path]:
    """Built once per process in a mkdtemp folder, removed once loaded."""
    private = Path(tempfile.mkdtemp(prefix="stepserve-kernels-"))
    try:
        return _load_from(private, name, isa)
    except Untrusted as why:
        raise KernelsUnavailable(f"the GGUF kernels could not be built: {why}") from why
    finally:
        shutil.rmtree(private, ignore_errors=True)


def remove_old_builds(cache_dir: Path) -> list[str]:
    """Remove (and name) the builds in a trusted `cache_dir` that no ISA's current one is."""
    current = {library_name(isa) for isa in ISAS}
    try:
        folder_fd = _open_checked(f"the kernel cache {cache_dir}", cache_dir, _OPEN_FOLDER)
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


# ---- the CPU, and which build it runs ----

def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), None)
    except OSError:
        return None


def _check_cpu() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise KernelsUnavailable(f"the GGUF kernels need x86-64 (this is {platform.machine()})")
    flags = _cpu_flags()
    if flags is not None:
        missing = [f for f in _REQUIRED_CPU_FLAGS if f not in flags]
        if missing:
            raise KernelsUnavailable(f"the GGUF kernels need AVX2, FMA and F16C; this CPU "
                                     f"lacks {', '.join(missing)}")
    elif torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise KernelsUnavailable("the GGUF kernels need AVX2 (torch reports "
                                 f"{torch.backends.cpu.get_cpu_capability()})")


def choose_isa(wanted: str | None = None) -> str:
    """`wanted`, else $STEPSERVE_KERNEL_ISA, else the widest ISA this CPU runs."""
    wanted = wanted or os.environ.get(ISA_ENV) or None
    if wanted is None:
        return (available_isas() or ["avx2"])[-1]
    if wanted not in ISAS:
        raise KernelsUnavailable(f"{ISA_ENV} = {wanted!r}: must be one of {', '.join(ISAS)}")
    flags = _cpu_flags() or set()
    missing = [f for f in ISAS[wanted][1] if f not in flags]
    if missing:
        raise KernelsUnavailable(f"the {wanted} kernels need CPU flags this CPU lacks: "
                                 f"{', '.join(missing)}")
    return wanted


def available_isas() -> list[str]:
    flags = _cpu_flags() or set()
    return [isa for isa, (_, needs) in ISAS.items() if all(f in flags for f in needs)]


# ---- the library's entry points ----

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def _entry(fn: Any, argtypes: list[Any], restype: Any) -> Any:
    fn.argtypes, fn.restype = argtypes, restype
    return fn


class GGMLKernels:
    """The library's entry points, checking their tensors and statuses."""

    def __init__(self, lib: ctypes.CDLL, path: Path, isa: str = "avx2") -> None:
        self.path, self.isa = path, isa
        self.layout = read_layout(lib, str(path))  # KernelsUnavailable on a mismatch
        try:
            self._matmul = _entry(lib.ggml_matmul,
                                  [_INT, _P, _I64, _I64, _P, _P, _I64, _P, _INT], _INT)
            self._dequantize = _entry(lib.ggml_dequantize,
                                      [_INT, _P, _P, _I64, _P, _I64, _P, _INT], None)
            self._scratch_floats = _entry(lib.decode_scratch_floats, [_P, _I64], _I64)
            # called by fused_decode.py, which checks their tensors
            self.decode_layers_raw = _entry(
                lib.decode_layers, [_P, _I64, _P, ctypes.c_float, ctypes.c_float, _P, _I64,
                                    _P, _P, _P, _P, _I64, _P, _P, _P, _INT], _INT)
            self.decode_attention_raw = _entry(
                lib.paged_decode_attention, [_P, _I64, _P, _P, _P, _I64, _P, _I64, _P,
                                             ctypes.c_float, _P, _INT], _INT)
        except AttributeError as e:  # the layout matched, an entry point is missing
            raise KernelsUnavailable(f"the kernel library {path} lacks an entry point: "
                                     f"{e}") from e

    @staticmethod
    def check_status(status: int, what: str) -> None:
        if status == KERNEL_OUT_OF_MEMORY:
            raise MemoryError(f"{what}: the kernels could not allocate their per-thread "
                              "buffers (out of memory); nothing was computed")
        if status != KERNEL_OK:
            raise RuntimeError(f"{what} returned the unknown status {status}")

    def weights(self, what: str, fmt: int, qs: torch.Tensor, scales: torch.Tensor,
                k: int, n: int | None = None) -> tuple[int, int, int]:
        """(quants, scales) pointers of a [n, k] matrix in `fmt`, and n (None: all of qs)."""
        if fmt not in _WEIGHTS:
            raise KernelArgumentError(f"{what}: weight format {fmt} is not one of "
                                      f"{sorted(_WEIGHTS)}")
        if k <= 0 or k % GROUP:
            raise KernelArgumentError(f"{what}: K = {k} must be a positive multiple of {GROUP}")
        dtype, qs_per_group, scales_per_group = _WEIGHTS[fmt]
        if n is None:
            n = qs.numel() // (k // GROUP * qs_per_group)
        groups = n * (k // GROUP)
        return (tensor_pointer(f"{what}'s quants", qs, dtype, numel=groups * qs_per_group),
                tensor_pointer(f"{what}'s scales", scales, torch.float16,
                               numel=groups * scales_per_group), n)

    def matmul(self, fmt: int, x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """out [M, N] = x [M, K] @ W.T, float32."""
        px = tensor_pointer("ggml_matmul's x", x, torch.float32, ndim=2)
        m, k = x.shape
        pq, ps, n = self.weights("ggml_matmul", fmt, qs, scales, k)
        py = tensor_pointer("ggml_matmul's out", out, torch.float32, (m, n))
        self.check_status(self._matmul(fmt, px, m, k, pq, ps, n, py, torch.get_num_threads()),
                          "ggml_matmul")
        return out

    def dequantize(self, fmt: int, qs: torch.Tensor, scales: torch.Tensor, k: int,
                   out: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """out [R, K] = rows `rows` (int64; None: the first R) of W as float32."""
        po = tensor_pointer("ggml_dequantize's out", out, torch.float32, (None, k))
        count = out.shape[0]
        pq, ps, n = self.weights("ggml_dequantize", fmt, qs, scales, k)
        pr = None
        if rows is not None:
            pr = tensor_pointer("ggml_dequantize's rows", rows, torch.int64, (count,))
            bounds = torch.aminmax(rows) if count else None
            if bounds is not None and (int(bounds.min) < 0 or int(bounds.max) >= n):
                raise KernelArgumentError(f"ggml_dequantize: a row index is out of range "
                                          f"[0, {n})")
        elif count > n:
            raise KernelArgumentError(f"ggml_dequantize: {count} rows asked of a {n}-row "
                                      "matrix")
        self._dequantize(fmt, pq, ps, k, pr, count, po, torch.get_num_threads())
        return out

    def scratch_floats(self, dims: torch.Tensor, rows: int) -> int:
        ptr = tensor_pointer("decode_scratch_floats' dims", dims, torch.int64,
                             (self.layout.dims.size,))
        return int(self._scratch_floats(ptr, rows))


def _self_test(kernels: GGMLKernels) -> None:
    """A wrong build (or a CPU that lied about its flags) must fail here, not in a model."""
    gen = torch.Generator().manual_seed(0)
    n, k = 40, 64
    x = torch.randn(3, k, generator=gen)
    qs = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, k // 32, 2, generator=gen) * 0.1).half()
    w = kernels.dequantize(FMT_Q4_1, qs, scales, k, torch.empty(n, k))
    lo, hi = (qs & 0xF).view(n, -1, 16), (qs >> 4).view(n, -1, 16)
    q = torch.cat([lo, hi], dim=-1).float()
    want = (q * scales[..., :1].float() + scales[..., 1:].float()).view(n, k)
    y = kernels.matmul(FMT_Q4_1, x, qs, scales, torch.empty(3, n))
    if not torch.equal(w, want) or not torch.allclose(y, x @ want.T, rtol=1e-4, atol=1e-4):
        raise KernelsUnavailable(f"the GGUF kernels built at {kernels.path} give wrong "
                                 "results on this machine")


@cache
def _load(cache_dir: str, isa: str | None) -> GGMLKernels | KernelsUnavailable:
    """The kernels, or why not (remembered: one compiler run per process)."""
    try:
        _check_cpu()
        isa = choose_isa(isa)
        lib, path = load_library(Path(cache_dir), isa)
        kernels = GGMLKernels(lib, path, isa)
        _self_test(kernels)
        if path.parent == Path(cache_dir):  # not a private build
            remove_old_builds(path.parent)
    except KernelsUnavailable as e:
        return e
    except (OSError, subprocess.SubprocessError) as e:  # an unreadable source, a hung compiler
        return KernelsUnavailable(f"the GGUF kernels could not be built: {e}")
    return kernels


def load_kernels(cache_dir: Path | None = None, isa: str | None = None) -> GGMLKernels:
    """The kernels for `isa` (choose_isa's), built into `cache_dir` (<cache root>/kernels)."""
    if cache_dir is None:
        from stepserve.model.presets import cache_root

        cache_dir = cache_root() / "kernels"
    loaded = _load(str(cache_dir), isa or os.environ.get(ISA_ENV) or None)
    if isinstance(loaded, KernelsUnavailable):
        raise KernelsUnavailable(str(loaded))
    return loaded


def kernels_unavailable_reason() -> str | None:
    try:
        load_kernels()
    except KernelsUnavailable as e:
        return str(e)
    return None
