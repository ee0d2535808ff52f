"""Which weight mode a runner uses (`quantization` with `dtype`), and what it costs in bytes.

    quantization  dtype     projections                      head / embedding (tied)
    none          float32   float32 GEMM (the reference)     float32
    none          bfloat16  bfloat16 GEMM                    bfloat16
    q4_1          float32   GGUF Q4_1 groups, our kernels    GGUF Q8_0 groups, our kernels

"auto" (the default) is q4_1 where it can run (a GGUF source, the CPU, float32, kernels
that build here), else none with the reason. q4_1 is the fastest mode on every CPU
measured, at every batch size, and its greedy output equals the float32 reference on the
same dequantised weights (docs/benchmarks.md, "Weight modes kept"). Imports no torch at
load time: the CLI reads `QUANTIZATION_CHOICES` from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

MODES = ("none", "q4_1")  # what a runner loads; "auto" picks one of them
QUANTIZATION_CHOICES = ("auto", *MODES)
MODE_DESCRIPTIONS = {"none": "float", "q4_1": "GGUF Q4_1/Q8_0 (stepserve kernels)"}


def quantization_for(quantization: str, dtype_flag: str) -> str:
    """The mode to ask the runner for, from the --quantization and --dtype flags as given:
    a dtype named (not auto) means float weights in it, so "auto" becomes "none" then;
    only an explicit --quantization q4_1 still picks the GGUF's groups."""
    return "none" if quantization == "auto" and dtype_flag != "auto" else quantization


def choose_quantization(wanted: str | None, dtype: str, device: torch.device,
                        gguf: Path | None) -> tuple[str, str | None]:
    """The mode to load, and a note when "auto" fell back to float weights because the
    machine cannot run the kernels (the reason); an explicit mode that cannot run here
    raises ValueError saying why. The model, device or dtype ruling q4_1 out is the
    user's own choice: "auto" then says nothing."""
    from stepserve.model.ggml_kernels import kernels_unavailable_reason

    wanted = "none" if wanted is None else wanted
    if wanted not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization = {wanted!r}: must be one of "
                         f"{', '.join(QUANTIZATION_CHOICES)} (or None)")
    if wanted == "none":
        return "none", None
    ruled_out = [why for hit, why in (
        (device.type != "cpu", f"runs on the CPU only; device is {device}"),
        (gguf is None, "loads the model's GGUF weights, and this model has no GGUF source "
                       "(the default model has one)"),
        (dtype != "float32", f"computes in float32, not {dtype}")) if hit]
    if ruled_out and wanted == "auto":
        return "none", None
    if ruled_out:
        raise ValueError(f"quantization = {wanted!r} {ruled_out[0]}")
    reason = kernels_unavailable_reason()
    if reason is None:
        return "q4_1", None
    if wanted == "auto":
        return "none", reason
    raise ValueError(f"quantization = {wanted!r} is unavailable here: {reason}")


def _unique_nbytes(tensors: list[torch.Tensor]) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _own_tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's own parameters and buffers (not its children's)."""
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def weight_nbytes(model: nn.Module) -> int:
    """Bytes of every weight the model holds (tied tensors once; the rope table excluded)."""
    return _unique_nbytes([t for m in model.modules() for t in _own_tensors(m)
                           if t is not getattr(model, "inv_freq", None)])


def streamed_weight_nbytes(model: nn.Module) -> int:
    """Bytes a decode step reads once from the weights: every layer, the final norm and
    the head. The embedding table counts only when it is the (tied) head: a lookup reads
    a few rows of it."""
    head = next(h for h in (model.packed_head, model.lm_head, model.embed_tokens)
                if h is not None)
    return _unique_nbytes([t for part in (*model.layers, model.norm, head)
                           for m in part.modules() for t in _own_tensors(m)])
