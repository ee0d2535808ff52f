"""The quantised loader end to end on a tiny GGUF written here: names, the Q/K row
permutation, fused projections, a float fallback tensor, the packed cache, and the modes'
outputs against the float model on the same dequantised weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from stepserve.model.ggml_kernels import kernels_unavailable_reason
from stepserve.model.gguf_convert import record_gguf_source
from stepserve.model.gguf_weights import load_packed_model, packed_path, unpermute_rows
from stepserve.model.runner import TorchRunner

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                   reason=str(kernels_unavailable_reason()))
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
    """A GGUF of the tiny model (layers Q4_1, embedding and head Q8_0, one F32 projection)
    next to a Hugging Face directory holding the float32 weights it dequantises to (the
    reference), which records the GGUF as its source. Returns the directory."""
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


@pytest.fixture(scope="module")
def gguf_dir(tiny_dir, tmp_path_factory) -> Path:
    return write_tiny_gguf(tiny_dir, tmp_path_factory.mktemp("gguf"))


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 9, 33, 17)]


def test_unpermute_undoes_llama_cpp_and_matches_transformers():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.arange(96 * 4, dtype=np.float32).reshape(96, 4)
    for heads in (3, 6):
        permuted = llama_cpp_permute(w, heads)
        ours = torch.from_numpy(permuted)[unpermute_rows(96, heads)].numpy()
        assert np.array_equal(ours, w)
        assert np.array_equal(ours, LlamaTensorProcessor()._reverse_permute_weights(
            permuted, heads))


@needs_kernels
def test_packed_weights_dequantize_to_the_reference(gguf_dir):
    from stepserve.model.weights import load_model

    gguf_path = gguf_dir.parent / "tiny.gguf"
    quant = load_packed_model(gguf_path, gguf_dir, "q4_1")
    ref = load_model(gguf_dir)
    assert packed_path(gguf_dir, gguf_path).is_file()
    from stepserve.model.quant import GGUFMatrix

    for ql, rl in zip(quant.layers, ref.layers, strict=True):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            q, r = ql.get_submodule(name), rl.get_submodule(name)
            w = q.weight if isinstance(q, torch.nn.Linear) else GGUFMatrix(
                q.fmt, q.qs, q.scales).dequantize()
            assert torch.equal(w, r.weight), name
    assert isinstance(quant.layers[1].mlp.down_proj, torch.nn.Linear)  # the F32 one
    assert quant.lm_head is not None and quant.packed_head is None  # untied


@needs_kernels
def test_q4_1_greedy_tokens_equal_the_float_reference(gguf_dir, driver):
    ref = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=128, quantization="none")
    quant = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=128, quantization="q4_1")
    assert quant.quantization == "q4_1" and "Q4_1" in quant.describe()
    assert quant.weight_bytes < ref.weight_bytes / 3
    want = driver(ref, prompts(), 12, chunk=5)
    assert driver(quant, prompts(), 12, chunk=5) == want
    auto = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=128)
    assert auto.quantization == "q4_1"


@pytest.mark.parametrize("quantization,dtype", [("int4", "float32"), ("int4", "bfloat16"),
                                                ("int8", "float32"), ("int8", "bfloat16")])
def test_torch_weight_only_modes_run(gguf_dir, driver, quantization, dtype):
    runner = TorchRunner(gguf_dir, block_size=4, num_gpu_blocks=128,
                         quantization=quantization, dtype=dtype)
    out = driver(runner, prompts(), 6, chunk=5)
    assert [len(o) for o in out] == [6] * len(prompts())


def test_packed_file_is_rebuilt_when_the_gguf_changes(gguf_dir, tmp_path):
    gguf_path = tmp_path / "copy.gguf"
    shutil.copy(gguf_dir.parent / "tiny.gguf", gguf_path)
    load_packed_model(gguf_path, gguf_dir, "int4")
    packed = packed_path(gguf_dir, gguf_path)
    first = packed.stat().st_mtime_ns
    load_packed_model(gguf_path, gguf_dir, "int4")
    assert packed.stat().st_mtime_ns == first  # reused
    gguf_path.touch()
    load_packed_model(gguf_path, gguf_dir, "int4")
    assert packed.stat().st_mtime_ns != first  # rebuilt


def test_mode_errors(gguf_dir, tiny_dir):
    with pytest.raises(ValueError, match="must be one of"):
        TorchRunner(gguf_dir, num_gpu_blocks=8, quantization="q5_k")
    with pytest.raises(ValueError, match="float32"):
        TorchRunner(gguf_dir, num_gpu_blocks=8, quantization="q4_1", dtype="bfloat16")
    with pytest.raises(ValueError, match="no GGUF source"):
        TorchRunner(tiny_dir, num_gpu_blocks=8, quantization="int4")
    with pytest.raises(ValueError, match="onednn"):
        TorchRunner(gguf_dir, num_gpu_blocks=8, quantization="int8", linear_backend="onednn")
    assert TorchRunner(tiny_dir, num_gpu_blocks=8).quantization == "none"  # auto, no GGUF
    assert TorchRunner(gguf_dir, num_gpu_blocks=8, dtype="bfloat16").quantization == "none"
