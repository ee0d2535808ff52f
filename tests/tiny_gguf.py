"""A GGUF of the tiny model, written the way llama.cpp's converter writes one (Q/K rows
permuted; layers Q4_1, embedding and head Q8_0, one projection left F32), next to a
Hugging Face directory holding the float32 weights it dequantises to: the reference the
quantised modes are compared with. The directory records the GGUF as its source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from stepserve.model.gguf_convert import record_gguf_source

FLOAT_TENSOR = "blk.1.ffn_down.weight"  # stored as F32: the loader's float fallback


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (what the loader undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    name = hf.removeprefix("model.")
    fixed = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")  # layers.N.block.proj.weight
    short = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
             "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
             "down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    key = parts[3] if parts[2] in ("self_attn", "mlp") else parts[2]
    return f"blk.{parts[1]}.{short[key]}.weight"


def write_tiny_gguf(tiny_dir: Path, out: Path) -> Path:
    """Write out/tiny.gguf and out/model (the reference directory); returns the latter."""
    import gguf

    config = json.loads((tiny_dir / "config.json").read_text())
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out / "tiny.gguf"), "llama")
    reference = {}
    for hf, tensor in sorted(load_file(str(tiny_dir / "model.safetensors")).items()):
        name, w = _gguf_name(hf), tensor.numpy()
        if w.ndim == 1 or name == FLOAT_TENSOR:
            writer.add_tensor(name, w)
            reference[hf] = tensor
            continue
        qtype = gguf.GGMLQuantizationType.Q8_0 if name in ("token_embd.weight",
                                                         "output.weight") \
            else gguf.GGMLQuantizationType.Q4_1
        heads = nh if name.endswith("attn_q.weight") else nkv if name.endswith(
            "attn_k.weight") else None
        stored = w if heads is None else llama_cpp_permute(w, heads)
        blocks = gguf.quants.quantize(stored, qtype)
        writer.add_tensor(name, blocks, raw_dtype=qtype)
        # quantisation is per row group and the permutation moves whole rows, so the
        # reference is the dequantised unpermuted matrix
        reference[hf] = torch.from_numpy(np.array(gguf.quants.dequantize(
            gguf.quants.quantize(w, qtype), qtype), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model_dir = out / "model"
    model_dir.mkdir()
    for f in ("config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json"):
        shutil.copy(tiny_dir / f, model_dir / f)
    save_file(reference, str(model_dir / "model.safetensors"))
    record_gguf_source(model_dir, out / "tiny.gguf")
    return model_dir
