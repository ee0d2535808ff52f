"""Decode-only steps in one C call for all layers (decode_kernels.c): at batch 1 the torch
path spends more time in ~40 small ops a layer and their Python than in the matmuls. It
applies to a float32 model whose projections the kernels read, without biases, and to
batches under `MAX_BATCH` rows (faster than torch at every batch up to 192: 549 vs 595 ms
on AVX2). Results equal the torch path's up to the order of sums.
"""

from __future__ import annotations

import torch
from torch import nn

from stepserve.model.ggml_kernels import FMT_F32, PROJECTIONS, GGMLKernels, tensor_pointer
from stepserve.model.kv_store import KVStore
from stepserve.model.llama import LlamaModel, RMSNorm
from stepserve.model.paged_attention import AttentionMetadata
from stepserve.model.quant import GGUFLinear

MAX_BATCH = 256  # decode rows from which the torch path runs (vLLM's default max_num_seqs)
# Each projection of kernel_abi.h's struct decode_layer, by its module in a layer.
_MODULES = dict(zip(PROJECTIONS, ("self_attn.qkv_proj", "self_attn.o_proj",
                                  "mlp.gate_up_proj", "mlp.down_proj"), strict=True))
_F32, _I64 = torch.float32, torch.int64


def _projection(module: nn.Module, kernels: GGMLKernels) -> tuple[int, int, int] | None:
    """(format, quants, scales) of a projection for struct decode_projection, or None if
    the kernel cannot run it."""
    if isinstance(module, GGUFLinear):
        qs, scales, _ = kernels.weights("decode_layers", module.kernel_format, module.qs,
                                        module.scales, module.in_features,
                                        module.out_features)
        return module.kernel_format, qs, scales
    if (type(module) is nn.Linear and module.bias is None
            and module.weight.dtype == torch.float32 and module.weight.is_contiguous()):
        return FMT_F32, tensor_pointer("decode_layers' weight", module.weight, _F32), 0
    return None


class FusedDecoder:
    """The fused decode path of one model; `for_model` says whether it applies."""

    def __init__(self, model: LlamaModel, kernels: GGMLKernels, layer_words: list[int],
                 max_batch: int) -> None:
        self.args, self.kernels, self.max_batch = model.args, kernels, max_batch
        self.layers = torch.tensor(layer_words, dtype=_I64)
        self.window = model.args.sliding_window or 0
        self._scratch = torch.empty(0)
        self._dims: torch.Tensor | None = None
        self._dims_key: tuple[int, int, int] | None = None
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
            if not all(type(n) is RMSNorm and n.weight.dtype == torch.float32
                       and n.weight.is_contiguous() for n in norms):
                return None
            values = dict(zip(("input_norm", "post_norm"), (
                tensor_pointer("decode_layers' norm", n.weight, _F32, (a.hidden_size,))
                for n in norms), strict=True))
            for p, m in _MODULES.items():
                found = _projection(layer.get_submodule(m), kernels)
                if found is None:
                    return None
                values.update(zip((f"{p}.format", f"{p}.qs", f"{p}.scales"), found, strict=True))
            words += kernels.layout.layer.words(**values)
        return cls(model, kernels, words, max_batch)

    def applies(self, meta: AttentionMetadata, kv: KVStore) -> bool:
        return (meta.prefill is None and meta.num_decode_tokens < self.max_batch
                and self.attends(meta, kv))

    def attends(self, meta: AttentionMetadata, kv: KVStore) -> bool:
        """Whether the decode rows of this (mixed) step can attend through the kernel."""
        return (meta.num_decode_tokens > 0 and meta.decode_lens is not None
                and kv.kv.dtype == torch.float32 and kv.kv.device.type == "cpu")

    def attend_decodes(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       scale: float, *, meta: AttentionMetadata, kv: KVStore) -> torch.Tensor:
        """[B, heads, head_dim]: each decode row's attention over its own paged context
        (q [B, heads, head_dim] of the step's decode rows; their K/V already cached)."""
        tables, lens, what = meta.decode_tables, meta.decode_lens, "paged_decode_attention"
        assert tables is not None and lens is not None
        b, heads, hd = q.shape
        q = q.contiguous()
        out = torch.empty(b, heads, hd)
        cache = (kv.num_blocks, kv.block_size, self.args.num_kv_heads, hd)
        status = self.kernels.decode_attention_raw(
            tensor_pointer(f"{what}'s q", q, _F32, (b, heads, hd)), heads * hd,
            tensor_pointer(f"{what}'s k_cache", k_cache, _F32, cache),
            tensor_pointer(f"{what}'s v_cache", v_cache, _F32, cache),
            tensor_pointer(f"{what}'s decode_tables", tables, _I64, (b, None)), tables.shape[1],
            tensor_pointer(f"{what}'s decode_lens", lens, _I64, (b,)), b,
            tensor_pointer(f"{what}'s dims", self._dims_for(kv), _I64), scale,
            tensor_pointer(f"{what}'s out", out, _F32, (b, heads, hd)),
            torch.get_num_threads())
        self.kernels.check_status(status, what)
        return out

    def _dims_for(self, kv: KVStore) -> torch.Tensor:
        """struct decode_dims, laid out as the library says."""
        a, key = self.args, (kv.num_blocks, kv.block_size, self.window)
        if self._dims is None or self._dims_key != key:
            words = self.kernels.layout.dims.words(
                hidden=a.hidden_size, heads=a.num_heads, kv_heads=a.num_kv_heads,
                head_dim=a.head_dim, intermediate=a.intermediate_size, num_blocks=kv.num_blocks,
                block_size=kv.block_size, window=self.window)
            self._dims, self._dims_key = torch.tensor(words, dtype=_I64), key
        return self._dims

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            meta: AttentionMetadata, kv: KVStore) -> torch.Tensor:
        """Every layer on x [B, hidden] (modified in place and returned); writes the step's
        K/V into `kv`. Call only where `applies` is true."""
        a, b, what = self.args, x.shape[0], "decode_layers"
        hd, tables, lens = a.head_dim, meta.decode_tables, meta.decode_lens
        assert tables is not None and lens is not None
        cos, sin = cos.contiguous(), sin.contiguous()
        dims = self._dims_for(kv)
        need = self.kernels.scratch_floats(dims, b)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        status = self.kernels.decode_layers_raw(
            tensor_pointer(f"{what}' layers", self.layers, _I64,
                           (a.num_layers * self.kernels.layout.layer.size,)),
            a.num_layers, tensor_pointer(f"{what}' dims", dims, _I64), float(a.rms_norm_eps),
            hd ** -0.5, tensor_pointer(f"{what}' x", x, _F32, (b, a.hidden_size)), b,
            tensor_pointer(f"{what}' cos", cos, _F32, (b, hd)),
            tensor_pointer(f"{what}' sin", sin, _F32, (b, hd)),
            tensor_pointer(f"{what}' slot_mapping", meta.slot_mapping, _I64, (b,)),
            tensor_pointer(f"{what}' decode_tables", tables, _I64, (b, None)), tables.shape[1],
            tensor_pointer(f"{what}' decode_lens", lens, _I64, (b,)),
            tensor_pointer(f"{what}' kv", kv.kv, _F32, (a.num_layers, 2, kv.num_blocks,
                                                           kv.block_size, a.num_kv_heads, hd)),
            tensor_pointer(f"{what}' scratch", self._scratch, _F32, at_least=need),
            torch.get_num_threads())
        self.kernels.check_status(status, what)
        self.steps += 1
        return x
