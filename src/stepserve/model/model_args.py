"""`ModelArgs`: the shape of a Llama-family decoder from a Hugging Face config.json, torch-free.
Llama, Mistral and Qwen2 differ only in a few switches recorded here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None or {"rope_type": "linear"|"llama3", ...}
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False  # Llama's attention_bias also puts one on o_proj; Qwen2 does not
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral: keys older than this many positions are hidden
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # compute and KV cache dtype
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads = {self.num_heads} is not a multiple of "
                             f"num_kv_heads = {self.num_kv_heads}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype = {self.dtype!r}: must be one of {', '.join(DTYPE_BYTES)}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", "default")
            if kind not in SUPPORTED_ROPE_TYPES:
                raise ValueError(f"rope scaling type {kind!r} is not supported; supported: "
                                 f"{', '.join(SUPPORTED_ROPE_TYPES)}")

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_parameters(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Rope base and scaling from either config style: transformers 5 writes
    `rope_parameters` (theta inside), earlier versions `rope_theta` + `rope_scaling`
    (with the type under "type" or "rope_type")."""
    params = cfg.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = dict(cfg.get("rope_scaling") or params)
    scaling.pop("rope_theta", None)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return theta, None
    if kind == "llama3":  # an unsupported kind: ModelArgs refuses it
        scaling.setdefault("original_max_position_embeddings",
                           cfg.get("max_position_embeddings", 8192))
    return theta, scaling


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def model_args_from_hf(cfg: dict[str, Any], dtype: str = "float32") -> ModelArgs:
    """ModelArgs from a parsed Hugging Face config.json; ValueError if unsupported."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(archs) if archs else f"none (model_type {cfg.get('model_type')!r})"
        raise ValueError(f"unsupported model architecture: {named}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    if arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        raise ValueError("Qwen2 with use_sliding_window = true is not supported")
    num_heads = cfg["num_attention_heads"]
    theta, scaling = _rope(cfg)
    is_qwen2 = arch == "Qwen2ForCausalLM"
    attention_bias = True if is_qwen2 else bool(cfg.get("attention_bias", False))
    return ModelArgs(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        o_proj_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        sliding_window=cfg.get("sliding_window") if arch == "MistralForCausalLM" else None,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_token_ids(cfg.get("eos_token_id")),
        dtype=dtype,
        architecture=arch,
    )


def load_model_args(model_dir: str | Path, dtype: str = "float32") -> ModelArgs:
    """Read `model_dir/config.json`; eos ids from generation_config.json win when present
    (chat models often stop on a different token than the base config names)."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json; is {model_dir} a Hugging Face "
                                "model directory?")
    args = model_args_from_hf(json.loads(path.read_text()), dtype)
    eos = generation_eos_ids(model_dir)
    return replace(args, eos_token_ids=eos) if eos else args


def generation_eos_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The eos ids `model_dir/generation_config.json` names; () without one."""
    gen = Path(model_dir) / "generation_config.json"
    return _token_ids(json.loads(gen.read_text()).get("eos_token_id")) if gen.is_file() else ()
