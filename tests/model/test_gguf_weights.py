"""The quantised loader end to end on a tiny GGUF written here: names, the Q/K row
permutation, fused projections, a float fallback tensor, the packed cache, and the modes'
outputs against the float model on the same dequantised weights."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from tiny_gguf import llama_cpp_permute

from stepserve.model.ggml_kernels import kernels_unavailable_reason
from stepserve.model.gguf_convert import unpermute_rows
from stepserve.model.runner import TorchRunner
from stepserve.model.weights import load_packed_model, packed_path

gguf = pytest.importorskip("gguf")
needs_kernels = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                   reason=str(kernels_unavailable_reason()))
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
    quant = load_packed_model(gguf_path, gguf_dir)
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


@needs_kernels
def test_packed_file_is_rebuilt_when_the_gguf_changes(gguf_dir, tmp_path):
    gguf_path = tmp_path / "copy.gguf"
    shutil.copy(gguf_dir.parent / "tiny.gguf", gguf_path)
    load_packed_model(gguf_path, gguf_dir)
    packed = packed_path(gguf_dir, gguf_path)
    first = packed.stat().st_mtime_ns
    load_packed_model(gguf_path, gguf_dir)
    assert packed.stat().st_mtime_ns == first  # reused
    gguf_path.touch()
    load_packed_model(gguf_path, gguf_dir)
    assert packed.stat().st_mtime_ns != first  # rebuilt


def test_mode_errors(gguf_dir, tiny_dir):
    with pytest.raises(ValueError, match="must be one of"):
        TorchRunner(gguf_dir, num_gpu_blocks=8, quantization="q5_k")
    for dropped in ("int4", "int8"):  # modes that flipped greedy tokens and ran slower
        with pytest.raises(ValueError, match="must be one of auto, none, q4_1"):
            TorchRunner(gguf_dir, num_gpu_blocks=8, quantization=dropped)
    with pytest.raises(ValueError, match="float32"):
        TorchRunner(gguf_dir, num_gpu_blocks=8, quantization="q4_1", dtype="bfloat16")
    with pytest.raises(ValueError, match="no GGUF source"):
        TorchRunner(tiny_dir, num_gpu_blocks=8, quantization="q4_1")
    assert TorchRunner(tiny_dir, num_gpu_blocks=8).quantization == "none"  # auto, no GGUF
    assert TorchRunner(gguf_dir, num_gpu_blocks=8, dtype="bfloat16").quantization == "none"
