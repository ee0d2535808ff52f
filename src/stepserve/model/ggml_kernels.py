"""The GGUF matrix kernels (ggml_kernels.c): built once with the system C compiler into the
cache directory, loaded with ctypes, checked against torch before first use.

Why our own kernels: torch's CPU weight-only kernels do not fit the GGUF's Q4_1 on an AVX2
machine. `_weight_int4pack_mm_for_cpu` vectorises only bfloat16 (activations, scales and
output all rounded to bfloat16, so even the weights are no longer the GGUF's), and its
float32 path is a scalar loop ~10x slower than a float32 GEMM; `_weight_int8pack_mm` holds
one scale per row, not per group of 32. These kernels read the GGUF's groups as they are
and compute in float32 (see the exactness note in the C file).

Built with `cc -O3 -mavx2 -mfma -mf16c -fopenmp` (~2 s), plus `-mavx512f -mavx512bw
-mavx512vl -mavx512dq` where the CPU has them (16-lane loops), plus `-mavx512vnni` where it
has that too (the int8 products of the q4_1_q8 mode, ggml_act8.c); `STEPSERVE_KERNEL_ISA`
loads a narrower build anyway; the library's name carries the ISA and a hash of the source
and flags, so an edit rebuilds it. Where the machine is not x86-64 with AVX2, or no
compiler works, `load_kernels()` raises `KernelsUnavailable` with the reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

# decode_kernels.c (the fused decode step, fused_decode.py) calls ggml_matmul: one library.
SOURCES = tuple(Path(__file__).with_name(n)
                for n in ("ggml_kernels.c", "ggml_act8.c", "decode_kernels.c"))
# included: in the hash, not compiled
HEADERS = tuple(Path(__file__).with_name(n) for n in ("ggml_groups.h", "ggml_panels.h"))
# -ffp-contract=off: no FMA where the C source writes a product and a sum (torch rounds
# both); the explicit fmadd intrinsics stay FMAs.
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-shared",
          "-fPIC", "-std=gnu11")
# Each instruction set the library is built for: its extra flags and the CPU flags it needs.
# avx512_vnni is the avx512 build plus the int8 dot products of the q4_1_q8 mode.
_AVX512 = (("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"),
           ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
ISAS = {"avx2": ((), ()),
        "avx512": _AVX512,
        "avx512_vnni": ((*_AVX512[0], "-mavx512vnni"), (*_AVX512[1], "avx512_vnni"))}
ISA_ENV = "STEPSERVE_KERNEL_ISA"  # a key of ISAS: which build to load (default: the widest)
FMT_Q4_1, FMT_Q8_0, FMT_Q4_1_Q8 = 0, 1, 3  # the C side's enum (ggml_groups.h)
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")


class KernelsUnavailable(RuntimeError):
    """The GGUF kernels cannot run here (the message says why)."""


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
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
    """The build to load: `wanted` (else $STEPSERVE_KERNEL_ISA, else the widest this CPU
    runs). KernelsUnavailable for a name not in ISAS or an ISA this CPU lacks."""
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
    """The builds this CPU runs, narrowest first (tests and benchmarks run each)."""
    flags = _cpu_flags() or set()
    return [isa for isa, (_, needs) in ISAS.items() if all(f in flags for f in needs)]


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelsUnavailable("the GGUF kernels are built on first use and no C compiler "
                             "was found (install gcc, or set CC)")


def _build(cache_dir: Path, isa: str) -> Path:
    source = b"".join(s.read_bytes() for s in (*SOURCES, *HEADERS))
    cc = _compiler()
    flags = (*CFLAGS, *ISAS[isa][0])
    digest = hashlib.sha256(source + " ".join((cc, *flags)).encode()).hexdigest()[:16]
    lib = cache_dir / f"ggml_kernels-{isa}-{digest}.so"
    if lib.is_file():
        return lib
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir)
    os.close(fd)
    try:
        result = subprocess.run([cc, *flags, "-o", tmp, *map(str, SOURCES)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise KernelsUnavailable(f"building the GGUF kernels with {cc} failed: "
                                     f"{result.stderr.strip()[-500:]}")
        os.replace(tmp, lib)  # atomic: a concurrent build's copy is as good as ours
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class GGMLKernels:
    """Typed wrappers around the library's entry points."""

    def __init__(self, path: Path, isa: str = "avx2") -> None:
        self.path, self.isa = path, isa
        lib = ctypes.CDLL(str(path))
        self._matmul = lib.ggml_matmul
        self._matmul.argtypes = [ctypes.c_int, _P, _I64, _I64, _P, _P, _I64, _P, ctypes.c_int]
        self._matmul.restype = None
        self._dequantize = lib.ggml_dequantize
        self._dequantize.argtypes = [ctypes.c_int, _P, _P, _I64, _P, _I64, _P, ctypes.c_int]
        self._dequantize.restype = None
        # Whether this build runs FMT_Q4_1_Q8 (int8 activations, AVX-512 VNNI).
        self.has_act8 = bool(lib.ggml_has_act8())
        self.decode_layers = lib.decode_layers  # fused_decode.py passes raw pointers
        self.decode_layers.argtypes = [_P, _I64, _P, ctypes.c_float, ctypes.c_float, _P, _I64,
                                       _P, _P, _P, _P, _I64, _P, _P, _P, ctypes.c_int]
        self.decode_layers.restype = None

    def matmul(self, fmt: int, x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """out [M, N] = x [M, K] @ W.T. Every tensor contiguous on the CPU; x, out float32."""
        m, k = x.shape
        self._matmul(fmt, x.data_ptr(), m, k, qs.data_ptr(), scales.data_ptr(),
                     out.shape[1], out.data_ptr(), torch.get_num_threads())
        return out

    def dequantize(self, fmt: int, qs: torch.Tensor, scales: torch.Tensor, k: int,
                   out: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """out [R, K] = rows `rows` (int64; None: the first R) of W as float32."""
        self._dequantize(fmt, qs.data_ptr(), scales.data_ptr(), k,
                         None if rows is None else rows.data_ptr(), out.shape[0],
                         out.data_ptr(), torch.get_num_threads())
        return out


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
    """The kernels, or why not: a failure is remembered too (once per process, not a
    compiler run per model load)."""
    try:
        _check_cpu()
        isa = choose_isa(isa)
        kernels = GGMLKernels(_build(Path(cache_dir), isa), isa)
        _self_test(kernels)
    except KernelsUnavailable as e:
        return e
    except (OSError, subprocess.SubprocessError) as e:  # unwritable cache, a hung compiler
        return KernelsUnavailable(f"the GGUF kernels could not be built: {e}")
    return kernels


def load_kernels(cache_dir: Path | None = None, isa: str | None = None) -> GGMLKernels:
    """The kernels for `isa` (default: choose_isa's), built into `cache_dir` (default:
    <cache root>/kernels) on first use."""
    if cache_dir is None:
        from stepserve.model.presets import cache_root

        cache_dir = cache_root() / "kernels"
    loaded = _load(str(cache_dir), isa or os.environ.get(ISA_ENV) or None)
    if isinstance(loaded, KernelsUnavailable):
        raise KernelsUnavailable(str(loaded))
    return loaded


def kernels_unavailable_reason() -> str | None:
    """None when the kernels load here, else why not."""
    try:
        load_kernels()
    except KernelsUnavailable as e:
        return str(e)
    return None
