"""Decode-only steps in one C call for all layers (decode_kernels.c).

At batch 1 the torch path spends more time around the matrix products than in them:
~40 small ops per layer (norms, RoPE, cache writes, the gathers and SDPA setup, SiLU,
residual adds) and the Python that issues them, each a few microseconds. `FusedDecoder`
runs every layer of a step whose sequences all decode one token in a single ctypes call
with raw pointers prepared at load time; the embedding lookup, RoPE's cos/sin, the final
norm and the head stay in llama.py.

It applies when the model is float32 with projections the kernels read (GGUF Q4_1 / Q8_0
groups, or float32 rows for a tensor the GGUF stores unquantised), no biases, and the
batch is decode-only with fewer than `max_batch` rows (MAX_BATCH: measured faster than
the torch path at every decode batch from 1 to 192, AVX2 and AVX-512 builds alike; at
192 rows 549 vs 595 ms and 388 vs 496 ms). Results equal the torch path's up to the
order of sums (tests/model/test_fused_decode.py).
"""

from __future__ import annotations

import torch
from torch import nn

from stepserve.model.ggml_kernels import GGMLKernels
from stepserve.model.kv_store import KVStore
from stepserve.model.llama import LlamaModel, RMSNorm
from stepserve.model.paged_attention import AttentionMetadata
from stepserve.model.quant import GGUFLinear

FMT_F32 = 2  # decode_kernels.c: a float32 [N, K] weight
MAX_BATCH = 256  # decode rows from which the torch path runs (vLLM's default max_num_seqs)
_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _projection_words(module: nn.Module) -> list[int] | None:
    """(format, quants, scales) pointers of a projection, or None if the kernel cannot
    run it."""
    if isinstance(module, GGUFLinear) and module.bias is None:
        return [module.kernel_format, module.qs.data_ptr(), module.scales.data_ptr()]
    if (type(module) is nn.Linear and module.bias is None
            and module.weight.dtype == torch.float32 and module.weight.is_contiguous()):
        return [FMT_F32, module.weight.data_ptr(), 0]
    return None


def _norm_ok(norm: nn.Module) -> bool:
    return (type(norm) is RMSNorm and norm.weight.dtype == torch.float32
            and norm.weight.is_contiguous())


class FusedDecoder:
    """The fused decode path of one model; `for_model` says whether it applies."""

    def __init__(self, model: LlamaModel, kernels: GGMLKernels, layer_words: list[int],
                 max_batch: int) -> None:
        a = model.args
        self.kernels, self.max_batch = kernels, max_batch
        self.layers = torch.tensor(layer_words, dtype=torch.int64)
        self.num_layers = a.num_layers
        self.eps, self.scale = float(a.rms_norm_eps), a.head_dim ** -0.5
        self.hidden = a.hidden_size
        self._dims_head = [a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim,
                           a.intermediate_size]
        self.window = a.sliding_window or 0
        self._per_row = (2 * a.hidden_size + (2 * a.num_heads + 2 * a.num_kv_heads) * a.head_dim
                         + 3 * a.intermediate_size)
        self._scratch = torch.empty(0)
        self._dims: torch.Tensor | None = None
        self._dims_key: tuple[int, int] | None = None
        self.steps = 0  # decode steps run fused (tests check the path is taken)

    @classmethod
    def for_model(cls, model: LlamaModel, kernels: GGMLKernels,
                  max_batch: int = MAX_BATCH) -> FusedDecoder | None:
        """The fused path for `model`, or None where the kernel cannot run one of its
        layers (a bias, a bfloat16 or packed weight, a norm of another kind)."""
        a = model.args
        if a.num_heads % a.num_kv_heads or a.head_dim % 2:
            return None
        words: list[int] = []
        for layer in model.layers:
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if not all(_norm_ok(n) for n in norms):
                return None
            words += [n.weight.data_ptr() for n in norms]
            for name in _PROJECTIONS:
                w = _projection_words(layer.get_submodule(name))
                if w is None:
                    return None
                words += w
        return cls(model, kernels, words, max_batch)

    def applies(self, meta: AttentionMetadata, kv: KVStore) -> bool:
        n = meta.num_decode_tokens
        return (meta.prefill is None and 0 < n < self.max_batch
                and meta.decode_lens is not None and kv.kv.dtype == torch.float32
                and kv.kv.device.type == "cpu")

    def _dims_for(self, kv: KVStore) -> torch.Tensor:
        key = (kv.num_blocks, kv.block_size)
        if self._dims is None or self._dims_key != key:
            self._dims = torch.tensor([*self._dims_head, *key, self.window], dtype=torch.int64)
            self._dims_key = key
        return self._dims

    def _scratch_for(self, rows: int) -> torch.Tensor:
        need = rows * self._per_row
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        return self._scratch

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            meta: AttentionMetadata, kv: KVStore) -> torch.Tensor:
        """Every layer on x [B, hidden] (modified in place and returned); writes the step's
        K/V into `kv`. Call only where `applies` is true."""
        b = x.shape[0]
        tables, lens = meta.decode_tables, meta.decode_lens
        assert tables is not None and lens is not None and x.is_contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        self.kernels.decode_layers(
            self.layers.data_ptr(), self.num_layers, self._dims_for(kv).data_ptr(), self.eps,
            self.scale, x.data_ptr(), b, cos.data_ptr(), sin.data_ptr(),
            meta.slot_mapping.data_ptr(), tables.data_ptr(), tables.shape[1], lens.data_ptr(),
            kv.kv.data_ptr(), self._scratch_for(b).data_ptr(), torch.get_num_threads())
        self.steps += 1
        return x
