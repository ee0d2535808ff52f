"""Shapes of well-known models (their Hugging Face `config.json`), for KV sizing and the
roofline cost model. `num_params` is the exact count those shapes give (Qwen2's q/k/v
bias and an untied lm_head included), matching the published totals; all ship in bf16."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer's shape (Llama family: GQA attention, SwiGLU MLP)."""

    name: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int
    dtype_bytes: int  # bytes per weight and per KV element (2 for bf16/fp16)
    vocab_size: int
    intermediate_size: int  # MLP width

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token over all layers: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("smollm2-135m", 134_515_008, 30, 576, 9, 3, 64, 2, 49_152, 1_536),
    ModelSpec("smollm2-360m", 361_821_120, 32, 960, 15, 5, 64, 2, 49_152, 2_560),
    ModelSpec("qwen2.5-0.5b", 494_032_768, 24, 896, 14, 2, 64, 2, 151_936, 4_864),
    ModelSpec("qwen2.5-7b", 7_615_616_512, 28, 3_584, 28, 4, 128, 2, 152_064, 18_944),
    # 48 layers x 8 KV heads x 128 x 2 x bf16 = 192 KiB per token: the promo-spike figure
    ModelSpec("qwen2.5-14b", 14_770_033_664, 48, 5_120, 40, 8, 128, 2, 152_064, 13_824),
    ModelSpec("llama-2-7b", 6_738_415_616, 32, 4_096, 32, 32, 128, 2, 32_000, 11_008),
    ModelSpec("llama-2-13b", 13_015_864_320, 40, 5_120, 40, 40, 128, 2, 32_000, 13_824),
    # Llama 3.1 8B/70B have the same shapes as Llama 3 8B/70B.
    ModelSpec("llama-3-8b", 8_030_261_248, 32, 4_096, 32, 8, 128, 2, 128_256, 14_336),
    ModelSpec("llama-3-70b", 70_553_706_496, 80, 8_192, 64, 8, 128, 2, 128_256, 28_672),
    # Mistral 7B v0.1/v0.2; v0.3 grew the vocabulary to 32,768.
    ModelSpec("mistral-7b", 7_241_732_096, 32, 4_096, 32, 8, 128, 2, 32_000, 14_336),
)
MODEL_SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def list_model_specs() -> list[ModelSpec]:
    """All presets, smallest first."""
    return sorted(MODEL_SPECS.values(), key=lambda spec: spec.num_params)


def get_model_spec(name: str) -> ModelSpec:
    """The preset called `name` (case-insensitive)."""
    spec = MODEL_SPECS.get(name.strip().lower()) if isinstance(name, str) else None
    if spec is None:
        known = ", ".join(spec.name for spec in list_model_specs())
        raise ValueError(f"unknown model spec {name!r}; known: {known}")
    return spec
