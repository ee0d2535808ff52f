"""The fused decode path (fused_decode.py, decode_kernels.c) against llama.py's torch path
on the same weights: hidden states and written K/V on ragged decode batches (windowed
too), greedy tokens end to end, and that the runner takes the path exactly where it
should."""

from __future__ import annotations

import pytest
import torch

from stepserve.core.output import SchedulerOutput
from stepserve.model.fused_decode import MAX_BATCH, FusedDecoder
from stepserve.model.ggml_kernels import (
    ISA_ENV,
    available_isas,
    kernels_unavailable_reason,
    load_kernels,
)
from stepserve.model.paged_attention import build_attention_metadata
from stepserve.model.runner import TorchRunner
from stepserve.profile.job import measure_step

pytestmark = pytest.mark.skipif(kernels_unavailable_reason() is not None,
                                reason=str(kernels_unavailable_reason()))
pytest.importorskip("gguf")
BS = 4


MODES = [("q4_1", isa) for isa in available_isas()]  # each kernel build


def q4_runner(gguf_dir, quantization="q4_1", **kw) -> TorchRunner:
    return TorchRunner(gguf_dir, block_size=BS, num_gpu_blocks=160, quantization=quantization,
                       **kw)


def decode_step(runner, ctx_lens, window=None, seed=0):
    """Random K/V history in shuffled blocks, then the metadata, ids and positions of one
    decode token per sequence (context lengths `ctx_lens`, the new token included)."""
    g = torch.Generator().manual_seed(seed)
    runner.kv.kv.copy_(torch.randn(runner.kv.kv.shape, generator=g))
    blocks = torch.randperm(runner.kv.num_blocks, generator=g).tolist()
    tables = []
    for n in ctx_lens:
        need = -(-n // BS)
        tables.append(blocks[:need])
        del blocks[:need]
    meta, positions = build_attention_metadata(
        [n - 1 for n in ctx_lens], [1] * len(ctx_lens), tables, BS, torch.device("cpu"),
        window, num_decode=len(ctx_lens))
    ids = torch.randint(3, 500, (len(ctx_lens),), generator=g)
    return meta, positions, ids


@pytest.mark.parametrize("quantization,isa", MODES)
@pytest.mark.parametrize("ctx_lens,window", [([1], None), ([5, 17, 2, 40], None),
                                             ([33, 9, 12], 6)])
def test_fused_layers_equal_the_torch_path(gguf_dir, ctx_lens, window, quantization, isa,
                                           monkeypatch):
    monkeypatch.setenv(ISA_ENV, isa)  # every kernel the runner loads is this build's
    runner = q4_runner(gguf_dir, quantization)
    assert runner.model.fused_decode.kernels.isa == isa
    model = runner.model
    fused = model.fused_decode
    assert isinstance(fused, FusedDecoder)
    fused.window = window or 0
    meta, positions, ids = decode_step(runner, ctx_lens, window)
    kv_before = runner.kv.kv.clone()
    with torch.inference_mode():
        got = model.hidden_states(ids, positions, meta, runner.kv).clone()
        kv_fused = runner.kv.kv.clone()
        assert fused.steps == 1
        assert "decode" not in vars(meta)  # the torch path's groups were never built
        runner.kv.kv.copy_(kv_before)
        model.fused_decode = None
        want = model.hidden_states(ids, positions, meta, runner.kv)
    # Rounding-level: the order of sums, and the kernel's own vectorised exp (within 1 ulp,
    # as torch's is; not the same one) in softmax and SiLU, over every layer.
    torch.testing.assert_close(got, want, rtol=5e-5, atol=5e-5)
    torch.testing.assert_close(kv_fused, runner.kv.kv, rtol=5e-5, atol=5e-5)
    assert not torch.equal(kv_fused, kv_before)  # the step's K/V were written


@pytest.mark.parametrize("quantization,isa", MODES)
def test_greedy_tokens_equal_the_torch_path(gguf_dir, driver, quantization, isa, monkeypatch):
    monkeypatch.setenv(ISA_ENV, isa)
    prompts = [torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n))
               .tolist() for n in (1, 9, 33, 17)]
    fused = q4_runner(gguf_dir, quantization)
    plain = q4_runner(gguf_dir, quantization)
    plain.model.fused_decode = None
    want = driver(plain, prompts, 12, chunk=5)
    assert driver(fused, prompts, 12, chunk=5) == want
    assert fused.model.fused_decode.steps > 5


def test_runner_takes_the_fused_path_only_for_small_decode_only_steps(gguf_dir):
    runner = q4_runner(gguf_dir)
    fused = runner.model.fused_decode
    assert fused is not None and fused.max_batch == MAX_BATCH
    measure_step(runner, 3, 10, repeats=2, warmup=1)
    assert fused.steps == 3
    measure_step(runner, 2, 10, prefill_tokens=5, repeats=2, warmup=0)  # a chunk rides along
    assert fused.steps == 3
    fused.max_batch = 3  # from max_batch rows up the torch path runs
    measure_step(runner, 3, 10, repeats=1, warmup=0)
    assert fused.steps == 3


def test_models_the_kernel_cannot_run_get_no_fused_path(gguf_dir):
    model = q4_runner(gguf_dir).model
    assert FusedDecoder.for_model(model, load_kernels(), 64) is not None
    model.layers[0].mlp.down_proj = torch.nn.Linear(192, 64, bias=True)  # a bias
    assert FusedDecoder.for_model(model, load_kernels(), 64) is None


def test_an_empty_step_and_swaps_leave_the_path_alone(gguf_dir):
    runner = q4_runner(gguf_dir)
    out = runner.execute(SchedulerOutput(0, [], [], block_tables=[]))
    assert out.sampled_token_ids == [] and runner.model.fused_decode.steps == 0
