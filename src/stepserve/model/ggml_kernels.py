"""The GGUF matrix kernels (ggml_kernels.c and the files beside it): built once with the
system C compiler into the cache folder (kernel_cache.py: only a library this user alone
owns is loaded), loaded with ctypes, their layout checked against kernel_abi.h
(kernel_abi.py), checked against torch before first use.

Why our own kernels: torch's CPU weight-only kernels do not fit the GGUF's Q4_1 on an AVX2
machine. `_weight_int4pack_mm_for_cpu` vectorises only bfloat16 (activations, scales and
output all rounded to bfloat16, so even the weights are no longer the GGUF's), and its
float32 path is a scalar loop ~10x slower than a float32 GEMM; `_weight_int8pack_mm` holds
one scale per row, not per group of 32. These kernels read the GGUF's groups as they are
and compute in float32 (see the exactness note in ggml_groups.h).

Built with `cc -O3 -mavx2 -mfma -mf16c -fopenmp` (~2 s), plus `-mavx512f -mavx512bw
-mavx512vl -mavx512dq` where the CPU has them (16-lane loops); `STEPSERVE_KERNEL_ISA=avx2`
loads the narrower build anyway. Where the machine is not x86-64 with AVX2, no compiler
works, or the library's layout differs from kernel_abi.h, `load_kernels()` raises
`KernelsUnavailable` with the reason. Every tensor is checked before its pointer crosses
(kernel_abi.py); a kernel that could not allocate raises MemoryError.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import torch

from stepserve.model.kernel_abi import (
    FMT_F32,
    FMT_Q4_1,
    FMT_Q8_0,
    KERNEL_OK,
    KERNEL_OUT_OF_MEMORY,
    KernelArgumentError,
    KernelsUnavailable,
    read_layout,
    tensor_pointer,
)
from stepserve.model.kernel_cache import ISAS, load_library, remove_old_builds

__all__ = ["FMT_F32", "FMT_Q4_1", "FMT_Q8_0", "ISAS", "ISA_ENV",
           "GGMLKernels", "KernelArgumentError", "KernelsUnavailable", "available_isas",
           "choose_isa", "kernels_unavailable_reason", "load_kernels"]

ISA_ENV = "STEPSERVE_KERNEL_ISA"  # a key of ISAS: which build to load (default: the widest)
_REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")


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


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
GROUP = 32  # weights per GGUF group: K is a multiple of it
# Per format: the quants' dtype, quant bytes and scales per group (ggml_groups.h's layout).
_WEIGHTS = {FMT_Q4_1: (torch.uint8, 16, 2), FMT_Q8_0: (torch.int8, 32, 1)}


def _entry(fn: Any, argtypes: list[Any], restype: Any) -> Any:
    """The ctypes function `fn`, typed."""
    fn.argtypes, fn.restype = argtypes, restype
    return fn


class GGMLKernels:
    """Typed wrappers around the library's entry points; each checks its tensors before
    their pointers cross (kernel_abi.tensor_pointer) and turns a kernel's status into an exception."""

    def __init__(self, lib: ctypes.CDLL, path: Path, isa: str = "avx2") -> None:
        self.path, self.isa = path, isa
        self.layout = read_layout(lib, str(path))  # KernelsUnavailable on a mismatch
        try:
            self._bind(lib)
        except AttributeError as e:  # the layout matched, an entry point is missing
            raise KernelsUnavailable(f"the kernel library {path} lacks an entry point: "
                                     f"{e}") from e

    def _bind(self, lib: ctypes.CDLL) -> None:
        self._matmul = _entry(lib.ggml_matmul, [_INT, _P, _I64, _I64, _P, _P, _I64, _P, _INT],
                              _INT)
        self._dequantize = _entry(lib.ggml_dequantize,
                                  [_INT, _P, _P, _I64, _P, _I64, _P, _INT], None)
        self._scratch_floats = _entry(lib.decode_scratch_floats, [_P, _I64], _I64)
        # fused_decode.py checks its tensors (it knows the model's sizes) and calls this.
        self.decode_layers_raw = _entry(
            lib.decode_layers, [_P, _I64, _P, ctypes.c_float, ctypes.c_float, _P, _I64, _P, _P,
                                _P, _P, _I64, _P, _P, _P, _INT], _INT)
        # fused_decode.py checks its tensors and calls this too: the decode rows' attention
        # of a mixed step (decode_attention.c).
        self.decode_attention_raw = _entry(
            lib.paged_decode_attention, [_P, _I64, _P, _P, _P, _I64, _P, _I64, _P,
                                         ctypes.c_float, _P, _INT], _INT)

    @staticmethod
    def check_status(status: int, what: str) -> None:
        if status == KERNEL_OUT_OF_MEMORY:
            raise MemoryError(f"{what}: the kernels could not allocate their per-thread "
                              "buffers (out of memory); nothing was computed")
        if status != KERNEL_OK:
            raise RuntimeError(f"{what} returned the unknown status {status}")

    def weights(self, what: str, fmt: int, qs: torch.Tensor, scales: torch.Tensor,
                k: int, n: int | None = None) -> tuple[int, int, int]:
        """(quants, scales) pointers of a [n, k] matrix in `fmt`, and n (None: as many
        rows as `qs` holds)."""
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
        """out [M, N] = x [M, K] @ W.T. Every tensor contiguous on the CPU; x, out float32."""
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
        """The float32 scratch decode_layers needs for `rows` rows (its layout is the
        library's: kernel_abi.h)."""
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
    """The kernels, or why not: a failure is remembered too (once per process, not a
    compiler run per model load)."""
    try:
        _check_cpu()
        isa = choose_isa(isa)
        library = load_library(Path(cache_dir), isa)
        kernels = GGMLKernels(library.lib, library.path, isa)
        _self_test(kernels)
        if library.cache_dir is not None:
            remove_old_builds(library.cache_dir)
    except KernelsUnavailable as e:
        return e
    except (OSError, subprocess.SubprocessError) as e:  # an unreadable source, a hung compiler
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
