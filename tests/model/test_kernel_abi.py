"""The kernels' interface (kernel_abi.h) as the library reports it: Python reads the
structs' layout from the library instead of keeping a copy (a library whose structs are
laid out in another order computes the same), refuses a library it cannot fill with the
reason (and "auto" falls back to float weights with it), and a kernel that cannot
allocate its buffers raises MemoryError instead of crashing."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from stepserve.model import ggml_kernels
from stepserve.model.fused_decode import FusedDecoder
from stepserve.model.ggml_kernels import (
    ABI_VERSION,
    FMT_Q4_1,
    KERNEL_OUT_OF_MEMORY,
    KernelsUnavailable,
    kernels_unavailable_reason,
)
from stepserve.model.llama import rope_cos_sin
from stepserve.model.modes import choose_quantization
from stepserve.model.paged_attention import build_attention_metadata
from stepserve.model.runner import TorchRunner

pytestmark = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                reason=str(kernels_unavailable_reason()))
BS = 4


def plant_variant(tmp_path: Path, *defines: str,
                  edit: Callable[[str], str] | None = None) -> Path:
    """A trusted cache folder holding, under the current build's name, a library built
    from a copy of the sources with kernel_abi.h edited by `edit` and `defines` set."""
    src, cache = tmp_path / "src", tmp_path / "cache" / "kernels"
    src.mkdir()
    cache.mkdir(parents=True, mode=0o700)
    for f in (*ggml_kernels.SOURCES, *ggml_kernels.HEADERS):
        shutil.copy(f, src / f.name)
    if edit is not None:
        header = src / "kernel_abi.h"
        edited = edit(header.read_text())
        assert edited != header.read_text()
        header.write_text(edited)
    isa = ggml_kernels.choose_isa()
    subprocess.run([ggml_kernels.compiler(), *ggml_kernels.CFLAGS, *ggml_kernels.ISAS[isa][0],
                    *defines, "-o", str(cache / ggml_kernels.library_name(isa)),
                    *(str(src / f.name) for f in ggml_kernels.SOURCES)],
                   check=True, capture_output=True)
    return cache


def grow_dims(header: str) -> str:
    return header.replace("    int64_t window;", "    int64_t window;\n    int64_t rope_theta;")


@pytest.mark.parametrize("defines,edit,reason", [
    (("-DSTEPSERVE_ABI_VERSION=999",), None,
     f"has ABI version 999; this stepserve reads version {ABI_VERSION}"),
    ((), lambda h: h.replace("FMT_F32 = 2,", "FMT_F32 = 5,"),
     "disagrees with kernel_abi.h: FMT_F32 = 5 (expected 2)"),
    ((), grow_dims, "lays out struct decode_dims in 72 bytes"),
], ids=["version", "format", "grown-struct"])
def test_a_library_of_another_layout_is_refused_with_the_reason(tmp_path, monkeypatch,
                                                                defines, edit, reason):
    plant_variant(tmp_path, *defines, edit=edit)
    monkeypatch.setenv("STEPSERVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KernelsUnavailable, match=re.escape(reason)):
        ggml_kernels.load_kernels()
    # "auto" falls back to float weights and says why, as for a build that failed.
    assert choose_quantization("auto", "float32", torch.device("cpu"),
                               tmp_path / "model.gguf") == ("none", kernels_unavailable_reason())
    assert reason in str(kernels_unavailable_reason())


def test_a_library_with_the_layout_but_not_the_kernels_is_refused(tmp_path):
    cache = tmp_path / "kernels"
    cache.mkdir(mode=0o700)
    abi = next(f for f in ggml_kernels.SOURCES if f.name == "kernel_abi.c")
    subprocess.run([ggml_kernels.compiler(), "-shared", "-fPIC", "-o",
                    str(cache / ggml_kernels.library_name(ggml_kernels.choose_isa())),
                    str(abi)], check=True)
    with pytest.raises(KernelsUnavailable, match="lacks an entry point"):
        ggml_kernels.load_kernels(cache)


def decode_batch(runner: TorchRunner, ctx_lens: list[int]):
    """One decode token per sequence over random K/V: (x, cos, sin, meta)."""
    g = torch.Generator().manual_seed(3)
    runner.kv.kv.copy_(torch.randn(runner.kv.kv.shape, generator=g))
    tables, next_block = [], 0
    for n in ctx_lens:
        tables.append(list(range(next_block, next_block - (-n // BS))))
        next_block = tables[-1][-1] + 1
    meta, positions = build_attention_metadata(
        [n - 1 for n in ctx_lens], [1] * len(ctx_lens), tables, BS, torch.device("cpu"),
        num_decode=len(ctx_lens))
    a = runner.model.args
    x = torch.randn(len(ctx_lens), a.hidden_size, generator=g)
    cos, sin = rope_cos_sin(runner.model.inv_freq, positions, torch.float32)
    return x, cos, sin, meta


@pytest.fixture
def runner(gguf_dir) -> TorchRunner:
    return TorchRunner(gguf_dir, block_size=BS, num_gpu_blocks=32, quantization="q4_1")


def test_the_layout_is_read_from_the_library(tmp_path, runner):
    """Every struct's fields in reverse order: the fused step computes the same."""
    def reverse(header: str) -> str:
        return (header.replace("int64_t hidden, heads, kv_heads, head_dim, intermediate;",
                               "int64_t intermediate, head_dim, kv_heads, heads, hidden;")
                .replace("int64_t num_blocks, block_size;", "int64_t block_size, num_blocks;")
                .replace("int64_t input_norm, post_norm;", "int64_t post_norm, input_norm;")
                .replace("int64_t format, qs, scales;", "int64_t scales, qs, format;"))

    reversed_kernels = ggml_kernels.load_kernels(plant_variant(tmp_path, edit=reverse))
    plain = runner.model.fused_decode
    other = FusedDecoder.for_model(runner.model, reversed_kernels)
    assert other is not None and not torch.equal(other.layers, plain.layers)
    x, cos, sin, meta = decode_batch(runner, [5, 9, 2])
    kv = runner.kv.kv.clone()
    want = plain.run(x.clone(), cos, sin, meta, runner.kv)
    kv_want = runner.kv.kv.clone()
    runner.kv.kv.copy_(kv)
    assert torch.equal(other.run(x.clone(), cos, sin, meta, runner.kv), want)
    assert torch.equal(runner.kv.kv, kv_want)


def test_a_step_that_cannot_allocate_raises_memory_error(runner):
    """A context too long for its scores buffer: the kernel says so, and nothing is
    written (the old kernel wrote through the NULL it got)."""
    x, cos, sin, meta = decode_batch(runner, [5, 9])
    meta.decode_lens[1] = 1 << 60
    kv, before = runner.kv.kv.clone(), x.clone()
    with pytest.raises(MemoryError, match="decode_layers: the kernels could not allocate"):
        runner.model.fused_decode.run(x, cos, sin, meta, runner.kv)
    assert torch.equal(x, before) and torch.equal(runner.kv.kv, kv)


def test_a_product_that_cannot_allocate_returns_the_status():
    """ggml_matmul's panel for K = 2^56 cannot be allocated: the status comes back before
    anything is read (the entry point called directly: the wrapper's checks would refuse
    tensors this large long before)."""
    kernels = ggml_kernels.load_kernels()
    x, qs = torch.zeros(16, 64), torch.zeros(4, 32, dtype=torch.uint8)
    scales, y = torch.zeros(4, 2, 2, dtype=torch.float16), torch.full((16, 4), 7.0)
    status = kernels._matmul(FMT_Q4_1, x.data_ptr(), 16, 1 << 56, qs.data_ptr(),
                             scales.data_ptr(), 4, y.data_ptr(), 2)
    assert status == KERNEL_OUT_OF_MEMORY and torch.equal(y, torch.full((16, 4), 7.0))
    with pytest.raises(MemoryError, match="ggml_matmul: the kernels could not allocate"):
        kernels.check_status(status, "ggml_matmul")
