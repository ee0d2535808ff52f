"""The kernel library's interface as Python sees it: the layout defined once in
kernel_abi.h, and the check every tensor passes before its pointer crosses.

The enums and the version are read from the header itself at import (quant.py and the
tests need the format ids before any library is built); the structs' sizes and field
offsets are read from the loaded library (`read_layout`), whose own copy of the enums and
version must match the header's. A library that differs in any of them, or whose structs
hold fields Python does not fill, is refused with `KernelsUnavailable` saying what
differs: the caller falls back as for a library that could not be built.

A kernel reads raw memory: a float64 tensor read as float32, a CUDA pointer, a strided
view or a short buffer would give garbage or crash the process. Every ctypes call path
(ggml_kernels.py's wrappers, fused_decode.py) passes its tensors through `tensor_pointer`,
which raises `KernelArgumentError` naming the argument, what the kernel reads and what it
got. Cheap on purpose (a few attribute reads): a decode step makes ~120 such calls.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

HEADER = Path(__file__).with_name("kernel_abi.h")
VERSION_NAME = "STEPSERVE_ABI_VERSION"
# The fields Python fills, by name; their order and offsets are the library's.
DIMS_FIELDS = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "num_blocks",
               "block_size", "window")
PROJECTIONS = ("qkv", "o", "gate_up", "down")
LAYER_FIELDS = ("input_norm", "post_norm",
                *(f"{p}.{f}" for p in PROJECTIONS for f in ("format", "qs", "scales")))
_WORD = 8  # every struct field is an int64


class KernelsUnavailable(RuntimeError):
    """The GGUF kernels cannot run here (the message says why)."""


class KernelArgumentError(ValueError):
    """A tensor a kernel cannot read as it is."""


@cache
def header_constants() -> dict[str, int]:
    """The header's enum members (one `NAME = value,` a line) and its ABI version."""
    text = HEADER.read_text()
    found = {m[1]: int(m[2]) for m in re.finditer(r"^\s*([A-Z][A-Z0-9_]*) = (-?\d+),",
                                                   text, re.MULTILINE)}
    version = re.search(rf"^#define {VERSION_NAME} (\d+)$", text, re.MULTILINE)
    if version is None or not found:
        raise RuntimeError(f"{HEADER} lost its {VERSION_NAME} or its enums")
    return {VERSION_NAME: int(version[1]), **found}


_HEADER = header_constants()
ABI_VERSION = _HEADER[VERSION_NAME]
FMT_Q4_1, FMT_Q8_0 = _HEADER["FMT_Q4_1"], _HEADER["FMT_Q8_0"]
FMT_F32 = _HEADER["FMT_F32"]
KERNEL_OK, KERNEL_OUT_OF_MEMORY = _HEADER["KERNEL_OK"], _HEADER["KERNEL_OUT_OF_MEMORY"]


@dataclass(frozen=True)
class StructLayout:
    """A struct of int64 fields as the library lays it out: `size` words, each field's
    word index."""

    name: str
    size: int
    fields: dict[str, int]

    def words(self, **values: int) -> list[int]:
        """The struct's words with every field set (a missing one is a bug: KeyError)."""
        out = [0] * self.size
        for name, index in self.fields.items():
            out[index] = values[name]
        return out


@dataclass(frozen=True)
class KernelLayout:
    """What a loaded library says about its interface, checked against Python's."""

    version: int
    dims: StructLayout
    layer: StructLayout

    def layer_words(self, input_norm: int, post_norm: int,
                    projections: dict[str, tuple[int, int, int]]) -> list[int]:
        """One layer's words; `projections`: (format, quants, scales) by PROJECTIONS name."""
        values = {"input_norm": input_norm, "post_norm": post_norm}
        for p, triple in projections.items():
            values.update(zip((f"{p}.format", f"{p}.qs", f"{p}.scales"), triple, strict=True))
        return self.layer.words(**values)


def library_entries(lib: ctypes.CDLL) -> dict[str, int] | None:
    """Every (name, value) the library exports; None where it exports none (built before
    the layout was exported, or not ours)."""
    try:
        entry = lib.stepserve_abi_entry
    except AttributeError:
        return None
    entry.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p),
                      ctypes.POINTER(ctypes.c_int64)]
    entry.restype = ctypes.c_int
    name, value, out = ctypes.c_char_p(), ctypes.c_int64(), {}
    while entry(len(out), ctypes.byref(name), ctypes.byref(value)):
        out[(name.value or b"").decode()] = value.value
    return out


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
    """The layout of the library loaded from `where`, or KernelsUnavailable naming what
    differs from kernel_abi.h."""
    entries = library_entries(lib)
    if entries is None:
        raise KernelsUnavailable(f"the kernel library {where} exports no layout "
                                 "(stepserve_abi_entry): not built from these sources")
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
    return KernelLayout(version, _struct(entries, "decode_dims", DIMS_FIELDS, where),
                        _struct(entries, "decode_layer", LAYER_FIELDS, where))


# ---- tensors crossing to C ----

Shape = tuple[int | None, ...]  # None: any size in that dimension


def _matches(got: torch.Size, want: Shape) -> bool:
    """got against a shape with wildcards (the slower path: a concrete shape compares at
    once)."""
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))


def _wanted(dtype: torch.dtype, shape: Shape | None, ndim: int | None, numel: int | None,
            at_least: int | None) -> str:
    text = f"a contiguous {str(dtype).removeprefix('torch.')} CPU tensor"
    if ndim is not None:
        text += f" of {ndim} dimensions"
    if shape is not None:
        text += f" of shape [{', '.join('*' if s is None else str(s) for s in shape)}]"
    if numel is not None:
        text += f" of {numel} elements"
    if at_least is not None:
        text += f" of at least {at_least} elements"
    return text


def _got(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    layout = "" if t.is_contiguous() else "non-contiguous "
    return (f"a {layout}{str(t.dtype).removeprefix('torch.')} tensor of shape "
            f"{list(t.shape)} on {t.device}")


def tensor_pointer(what: str, t: torch.Tensor, dtype: torch.dtype, shape: Shape | None = None,
                   *, ndim: int | None = None, numel: int | None = None,
                   at_least: int | None = None) -> int:
    """t's data pointer, after checking that it is a contiguous CPU tensor of `dtype` with
    the given shape (None: any size there), number of dimensions, element count, or at
    least that many elements."""
    if (not isinstance(t, torch.Tensor) or t.dtype is not dtype or not t.is_cpu
            or not t.is_contiguous()
            or (shape is not None and t.shape != shape and not _matches(t.shape, shape))
            or (ndim is not None and t.dim() != ndim)
            or (numel is not None and t.numel() != numel)
            or (at_least is not None and t.numel() < at_least)):
        wanted = _wanted(dtype, shape, ndim, numel, at_least)
        raise KernelArgumentError(f"{what} must be {wanted}; got {_got(t)}")
    return t.data_ptr()
