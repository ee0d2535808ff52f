"""A `LlamaModel`'s weights, float or quantised. Float (`load_model`): a Hugging Face
directory's safetensors, mapped onto our parameters by name (q/k/v and gate/up into the
fused ones); every parameter must be filled exactly once. Quantised (`load_packed_model`,
the `q4_1` mode): `pack_gguf` writes the GGUF's groups in our layout once to the model's
cache directory, and the model is built from that file, its config the converted one.

Huge pages: a decode step streams every weight once, and in 4 KB pages that is a TLB miss
per page; the GGUF buffers are copied into a madvise(MADV_HUGEPAGE) arena (batch-1 decode
on a Zen 5 EPYC: 3.03-3.12 ms against 3.20-3.62 ms as loaded).
"""


from __future__ import annotations

import json
import mmap
import os
import re
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from stepserve.model.ggml_kernels import load_kernels
from stepserve.model.gguf_convert import read_gguf
from stepserve.model.llama import LlamaModel, inv_frequencies
from stepserve.model.model_args import ModelArgs, load_model_args
from stepserve.model.quant import (
    KERNEL_FORMAT,
    DequantScratch,
    GGUFEmbedding,
    GGUFLinear,
    GGUFMatrix,
    GGUFModule,
)

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
    """Build the model on `device` in `dtype` (on the meta device first: initialising
    135M+ parameters would take longer than reading them) and load its checkpoint."""
    model_dir = Path(model_dir)
    args = load_model_args(model_dir, dtype)
    with torch.device("meta"):
        model = LlamaModel(args)
    model = model.to_empty(device=device).to(DTYPES[dtype])
    model.inv_freq = inv_frequencies(args).to(device)  # non-persistent: recompute, float32
    load_weights(model, model_dir)
    return model.requires_grad_(False).eval()


# ---- the quantised weights: the GGUF packed once into our layout ----

PACKED_FORMAT = "stepserve-gguf-packed/1"
# From this many activation rows up, GGUFLinear dequantises and runs a BLAS GEMM instead
# of its own kernel. AVX2: the two cross at 64 rows (SmolLM2's gate_up / down, 3.80 vs
# 3.74 ms a matrix); AVX-512: the kernel wins at every size (1,024-row prefill steps:
# 1,759 vs 1,913 ms).
GEMM_ROWS = {"avx2": 64, "avx512": 1 << 62}

# our projection -> (its block, the GGUF tensors it fuses)
_PARTS = {
    "qkv_proj": ("self_attn", ["attn_q", "attn_k", "attn_v"]),
    "o_proj": ("self_attn", ["attn_output"]),
    "gate_up_proj": ("mlp", ["ffn_gate", "ffn_up"]),
    "down_proj": ("mlp", ["ffn_down"]),
}


def packed_path(model_dir: Path, gguf_path: Path) -> Path:
    """The packed copy's path: in a subdirectory, out of the float loader's glob."""
    return Path(model_dir) / "quantized" / f"{gguf_path.stem}.safetensors"


def _source_tag(gguf_path: Path) -> str:
    """The GGUF a packed file came from: a changed file is packed again."""
    stat = gguf_path.stat()
    return f"{gguf_path.name}:{stat.st_size}:{stat.st_mtime_ns}"


def pack_gguf(gguf_path: Path, args: ModelArgs, out: Path) -> Path:
    """Write `gguf_path`'s weights to `out` (atomically): each quantised parameter P as
    `P.qs` and `P.scales`, its type in the metadata; other tensors as float32."""
    tensors = read_gguf(gguf_path).tensors
    if any(name.endswith(".bias") for name in tensors) or args.attention_bias \
            or args.o_proj_bias or args.mlp_bias:
        raise ValueError(f"{gguf_path.name}: projections with biases are not supported by "
                         "the quantised loader")
    state: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}

    def put(name: str, parts: list[str]) -> None:
        src = [tensors[n].unpermuted(args.num_heads, args.num_kv_heads) for n in parts]
        if len({t.type_name for t in src}) == 1 and src[0].runs_quantised:
            m = GGUFMatrix.cat([t.matrix() for t in src])
            state[f"{name}.qs"], state[f"{name}.scales"] = m.qs, m.scales
            types[name] = m.fmt
        else:
            state[name] = torch.cat([t.dequantized() for t in src])
            types[name] = "F32"

    for i in range(args.num_layers):
        for param, (block, parts) in _PARTS.items():
            put(f"layers.{i}.{block}.{param}", [f"blk.{i}.{g}.weight" for g in parts])
        put(f"layers.{i}.input_layernorm", [f"blk.{i}.attn_norm.weight"])
        put(f"layers.{i}.post_attention_layernorm", [f"blk.{i}.ffn_norm.weight"])
    put("norm", ["output_norm.weight"])
    put("embed_tokens", ["token_embd.weight"])
    if "output.weight" in tensors:
        put("lm_head", ["output.weight"])
    if args.tie_word_embeddings != ("output.weight" not in tensors):
        raise ValueError(f"config says tie_word_embeddings = {args.tie_word_embeddings}, "
                         f"the GGUF {'has' if 'output.weight' in tensors else 'lacks'} "
                         "output.weight")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    save_file(state, str(tmp), metadata={"format": PACKED_FORMAT, "source": _source_tag(
        gguf_path), "types": json.dumps(types)})
    os.replace(tmp, out)
    return out


def _read_packed(path: Path,
                 gguf_path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != PACKED_FORMAT or meta.get("source") != _source_tag(gguf_path):
            return None
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(meta["types"])  # noqa: SIM118


# ---- loading: the packed file into a model ----

class _Builder:
    """Makes each module from packed tensors: our kernels' layers on the GGUF's groups,
    float32 where a tensor is not in a type they run."""

    def __init__(self, state: dict[str, torch.Tensor], types: dict[str, str]) -> None:
        self.state, self.types = state, types
        self.kernels = load_kernels()
        self.scratch = DequantScratch()
        self.gemm_rows = GEMM_ROWS[self.kernels.isa]

    def matrix(self, name: str) -> GGUFMatrix | None:
        fmt = self.types[name]
        return (GGUFMatrix(fmt, self.state[f"{name}.qs"], self.state[f"{name}.scales"])
                if fmt in KERNEL_FORMAT else None)

    def float_weight(self, name: str) -> torch.Tensor:
        m = self.matrix(name)
        return self.state[name] if m is None else m.dequantize()

    def linear(self, name: str) -> nn.Module:
        m = self.matrix(name)
        if m is not None:
            return GGUFLinear(m, self.kernels, self.scratch, self.gemm_rows)
        weight = self.state[name]
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        return linear

    def norm_weight(self, name: str) -> nn.Parameter:
        return nn.Parameter(self.float_weight(name), requires_grad=False)


def load_packed_model(gguf_path: Path, model_dir: Path) -> LlamaModel:
    """The q4_1 mode's model: `model_dir`'s configuration, `gguf_path`'s groups (packed on
    first use) run by our kernels; float32, CPU."""
    args = load_model_args(model_dir)
    path = packed_path(model_dir, gguf_path)
    packed = (_read_packed(path, gguf_path)
              or _read_packed(pack_gguf(gguf_path, args, path), gguf_path))
    assert packed is not None
    build = _Builder(*packed)
    with torch.device("meta"):
        model = LlamaModel(args)
    for i, layer in enumerate(model.layers):
        for param, (block, _) in _PARTS.items():
            setattr(getattr(layer, block), param, build.linear(f"layers.{i}.{block}.{param}"))
        layer.input_layernorm.weight = build.norm_weight(f"layers.{i}.input_layernorm")
        layer.post_attention_layernorm.weight = build.norm_weight(
            f"layers.{i}.post_attention_layernorm")
    model.norm.weight = build.norm_weight("norm")
    embed = build.matrix("embed_tokens")
    if embed is not None:
        model.embed_tokens = GGUFEmbedding(embed, build.kernels)
        if args.tie_word_embeddings:  # the head reads the same groups, not a copy
            model.packed_head = GGUFLinear(embed, build.kernels, build.scratch, build.gemm_rows)
    else:
        model.embed_tokens = nn.Embedding.from_pretrained(build.float_weight("embed_tokens"),
                                                          freeze=True)
    if not args.tie_word_embeddings:
        model.lm_head = build.linear("lm_head")
    model.inv_freq = inv_frequencies(args)
    leftover = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if leftover:
        raise ValueError(f"{gguf_path.name}: no weights for {', '.join(leftover[:5])}")
    move_to_huge_pages(model)  # before anything (the fused decoder) takes pointers
    return model.requires_grad_(False).eval()


# ---- the quantised weights in one arena of 2 MB pages ----

ALIGN = 64  # bytes: a cache line, and the kernels' vector loads
_BUFFERS = ("qs", "scales")


def move_to_huge_pages(model: nn.Module) -> int:
    """Copy the GGUF modules' buffers into one 64-byte aligned huge-page arena (shared ones
    stay shared); its size in bytes, 0 where nothing moved or off Linux."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    modules = [m for m in model.modules() if isinstance(m, GGUFModule)]
    unique: dict[int, torch.Tensor] = {}
    for m in modules:
        for name in _BUFFERS:
            t = getattr(m, name)
            if t.device.type != "cpu" or not t.is_contiguous():
                return 0
            unique.setdefault(t.data_ptr(), t)
    offsets, size = {}, 0
    for ptr, t in unique.items():
        offsets[ptr] = size
        size += -(-t.nbytes // ALIGN) * ALIGN
    if size == 0:
        return 0
    arena = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arena.madvise(mmap.MADV_HUGEPAGE)
    base = torch.frombuffer(arena, dtype=torch.uint8)  # keeps `arena` alive
    copies = {}
    for ptr, t in unique.items():
        raw = base[offsets[ptr]:offsets[ptr] + t.nbytes]
        copy = raw.view(t.dtype).view(t.shape)
        copy.copy_(t)
        copies[ptr] = copy
    for m in modules:
        for name in _BUFFERS:
            setattr(m, name, copies[getattr(m, name).data_ptr()])
    return size
