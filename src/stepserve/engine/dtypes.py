"""`--dtype` as vLLM takes it (auto, half, float16, bfloat16, float, float32), turned
into a dtype the runner has (float32, float16, bfloat16) on a given device."""

from __future__ import annotations

import json

DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_SAME_AS = {"half": "float16", "float": "float32"}  # vLLM's other names


def resolve_dtype(name: str, model: str, device: str) -> str:
    """The runner's dtype for a --dtype value on `device` (a valid device name): auto is
    float32 on CPU (the runner's reference path, equal to transformers' float32) and the
    checkpoint's dtype elsewhere, as vLLM's auto (checkpoint_dtype). ValueError for an
    unknown name, or where the device cannot run the dtype."""
    import torch  # only commands that load a model get here

    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype = {name!r}: must be one of {', '.join(DTYPE_CHOICES)}")
    dev = torch.device(device)
    dtype = _SAME_AS.get(name, name)
    if dtype == "auto":
        dtype = "float32" if dev.type == "cpu" else checkpoint_dtype(model)
    if dtype == "bfloat16" and dev.type == "cuda" and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        raise ValueError(f"dtype = {name}: {device} has no bfloat16 support; use float16 "
                         "(half) or float32")
    return dtype


def checkpoint_dtype(model: str) -> str:
    """The dtype vLLM's auto picks for a checkpoint: float16 and bfloat16 as saved,
    anything else (float32, unknown) as float16."""
    from stepserve.model.presets import resolve_model

    cfg = json.loads((resolve_model(model) / "config.json").read_text())
    saved = cfg.get("torch_dtype") or cfg.get("dtype")
    return saved if saved in ("float16", "bfloat16") else "float16"
