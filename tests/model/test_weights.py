"""Checkpoint loading for each supported variant, checked against transformers on small
random checkpoints that transformers itself wrote; and the loading errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from stepserve.model.runner import TorchRunner
from stepserve.model.weights import load_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def small_config(cls_name: str, **extra):
    import transformers

    cls = getattr(transformers, cls_name)
    return cls(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               initializer_range=0.3, tie_word_embeddings=False, **extra)


def write_hf_model(tmp_path, tiny_dir, arch: str, config_cls: str, **extra):
    """A random checkpoint saved by transformers, sharded to exercise the index file."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, arch)(small_config(config_cls, **extra))
    with torch.no_grad():  # transformers zero-initialises biases; make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_dir / name, tmp_path / name)
    return tmp_path


def prompts(n: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 512, (L,), generator=g).tolist() for L in (3, 30, 12, 45, 1, 20)][:n]


VARIANTS = {
    "qwen2_bias": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "llama_attention_bias": ("LlamaForCausalLM", "LlamaConfig", {"attention_bias": True}),
    "llama3_rope": ("LlamaForCausalLM", "LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "linear_rope": ("LlamaForCausalLM", "LlamaConfig", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    "mistral_window": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 8}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_transformers(variant, tmp_path, tiny_dir, driver, reference):
    arch, config_cls, extra = VARIANTS[variant]
    model_dir = write_hf_model(tmp_path, tiny_dir, arch, config_cls, **extra)
    assert len(list(model_dir.glob("*.safetensors"))) > 1  # sharded
    runner = TorchRunner(model_dir, block_size=4, num_gpu_blocks=256)
    got = driver(runner, prompts(), 12, chunk=5, admit_per_step=2)
    assert got == reference(model_dir, prompts(), 12)


def test_qwen2_biases_are_loaded(tmp_path, tiny_dir):
    model_dir = write_hf_model(tmp_path, tiny_dir, "Qwen2ForCausalLM", "Qwen2Config")
    model = load_model(model_dir)
    bias = model.layers[0].self_attn.qkv_proj.bias
    assert bias is not None and bool(bias.abs().sum() > 0)
    assert model.layers[0].self_attn.o_proj.bias is None


def test_tied_embeddings_have_no_lm_head(default_args_dir):
    model = load_model(default_args_dir)
    assert model.lm_head is None


@pytest.fixture
def default_args_dir(tmp_path, tiny_dir):
    """The tiny model re-saved with tied embeddings (lm_head dropped from the file)."""
    config = json.loads((tiny_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = load_file(tiny_dir / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


def test_unknown_architecture_message(tmp_path, tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(tiny_dir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"unsupported model architecture: GPT2LMHeadModel; "
                                         r"supported: LlamaForCausalLM, MistralForCausalLM, "
                                         r"Qwen2ForCausalLM"):
        load_model(tmp_path)


def test_missing_tensor_is_an_error(tmp_path, tiny_dir):
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    tensors = load_file(tiny_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks 1 tensors.*layers\.1\.self_attn\.qkv_proj"):
        load_model(tmp_path)


def test_wrong_shape_is_an_error(tmp_path, tiny_dir):
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    tensors = load_file(tiny_dir / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.norm.weight.*shape"):
        load_model(tmp_path)


def test_no_safetensors_is_an_error(tmp_path, tiny_dir):
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(tmp_path)
