"""Tensors checked before their pointers cross to the C kernels (`tensor_pointer`).

A kernel reads raw memory: a float64 tensor read as float32, a CUDA pointer, a strided
view or a short buffer would give garbage or crash the process. Every ctypes call path
(ggml_kernels.py's wrappers, fused_decode.py) passes its tensors through this one check,
which raises `KernelArgumentError` naming the argument, what the kernel reads and what it
got. Cheap on purpose (a few attribute reads): a decode step makes ~120 such calls.
"""

from __future__ import annotations

import torch

Shape = tuple[int | None, ...]  # None: any size in that dimension


class KernelArgumentError(ValueError):
    """A tensor a kernel cannot read as it is."""


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
