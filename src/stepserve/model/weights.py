"""Load a Hugging Face model directory (config.json + *.safetensors, one file or shards
listed in model.safetensors.index.json) into a `LlamaModel`.

Checkpoint tensors map onto our parameters by name; q/k/v and gate/up are copied into
their slices of the fused `qkv_proj` / `gate_up_proj`. Every parameter must be filled
exactly once, so a missing or misnamed tensor is an error, not a silently random weight.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from stepserve.model.llama import LlamaModel, inv_frequencies
from stepserve.model.model_args import ModelArgs, load_model_args

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_LAYER = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)_proj\.(weight|bias)$")
# checkpoint projection -> (our fused parameter, which part)
_FUSED = {"q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2), "gate": ("gate_up", 0),
          "up": ("gate_up", 1)}
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.masked_bias|\.attn\.bias)$")


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files (only safetensors "
                                "checkpoints are supported)")
    return files


def _target(name: str, args: ModelArgs) -> tuple[str, int] | None:
    """Our parameter name and part index (-1: whole tensor) for a checkpoint tensor name;
    None for tensors we deliberately skip."""
    if _IGNORED.search(name):
        return None
    if name.startswith("model."):
        name = name[len("model."):]
    if name == "lm_head.weight":
        return None if args.tie_word_embeddings else ("lm_head.weight", -1)
    m = _LAYER.fullmatch(name)
    if m and m.group(3) in _FUSED:
        layer, block, proj, kind = m.groups()
        fused, part = _FUSED[proj]
        return f"layers.{layer}.{block}.{fused}_proj.{kind}", part
    return name, -1


def load_weights(model: LlamaModel, model_dir: Path) -> None:
    """Copy every checkpoint tensor into `model` (already on its device and dtype)."""
    args = model.args
    params = dict(model.named_parameters())
    splits = {name: _split_sizes(name, args) for name in params}
    filled: dict[str, set[int]] = {name: set() for name in params}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = _target(key, args)
                if target is None:
                    continue
                name, part = target
                if name not in params:
                    raise ValueError(f"{path.name}: tensor {key!r} has no place in a "
                                     f"{args.architecture} with this config")
                dest = params[name].data
                if part >= 0:
                    sizes = splits[name]
                    dest = dest.narrow(0, sum(sizes[:part]), sizes[part])
                tensor = f.get_tensor(key)
                if tensor.shape != dest.shape:
                    raise ValueError(f"{path.name}: tensor {key!r} has shape "
                                     f"{tuple(tensor.shape)}, expected {tuple(dest.shape)}")
                dest.copy_(tensor)
                filled[name].add(part)
    missing = [n for n, parts in filled.items() if len(parts) != max(len(splits[n]), 1)]
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. "
                         f"{', '.join(missing[:5])}")


def _split_sizes(name: str, args: ModelArgs) -> list[int]:
    """Row sizes of the parts of a fused parameter; [] for an ordinary one."""
    if ".qkv_proj." in name:
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        return [q, kv, kv]
    if ".gate_up_proj." in name:
        return [args.intermediate_size, args.intermediate_size]
    return []


def load_model(model_dir: str | Path, dtype: str = "float32",
               device: str | torch.device = "cpu") -> LlamaModel:
    """Build the model on `device` in `dtype` and load its checkpoint."""
    model_dir = Path(model_dir)
    args = load_model_args(model_dir, dtype)
    # Build on the meta device: random initialisation of 135M+ parameters would take
    # longer than reading them.
    with torch.device("meta"):
        model = LlamaModel(args)
    model = model.to_empty(device=device).to(DTYPES[dtype])
    model.inv_freq = inv_frequencies(args).to(device)  # non-persistent: recompute, float32
    load_weights(model, model_dir)
    return model.requires_grad_(False).eval()
