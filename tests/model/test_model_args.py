"""ModelArgs from Hugging Face config.json: the three architectures, rope styles, errors."""

from __future__ import annotations

import json

import pytest

from stepserve.model.model_args import ModelArgs, load_model_args, model_args_from_hf

SMOLLM2 = {  # as transformers 5 writes it (rope_parameters)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "max_position_embeddings": 8192, "bos_token_id": 1,
    "eos_token_id": 2,
}


def test_smollm2_shape_and_kv_bytes():
    a = model_args_from_hf(SMOLLM2)
    assert (a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim) == (30, 9, 3, 64)
    assert a.rope_theta == 100000.0 and a.rope_scaling is None
    assert a.tie_word_embeddings and not a.attention_bias
    assert a.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # 45 KiB in float32
    assert model_args_from_hf(SMOLLM2, "bfloat16").kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert 134e6 < a.num_parameters < 135e6  # the 134.5M of the model card


def test_llama3_rope_scaling_old_style():
    cfg = {**SMOLLM2, "rope_parameters": None, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    a = model_args_from_hf(cfg)
    assert a.rope_theta == 500000.0
    assert a.rope_scaling["rope_type"] == "llama3" and a.rope_scaling["factor"] == 8.0


def test_linear_rope_with_legacy_type_key():
    cfg = {**SMOLLM2, "rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert model_args_from_hf(cfg).rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_unsupported_rope_type_is_named():
    cfg = {**SMOLLM2, "rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4}}
    with pytest.raises(ValueError, match="'yarn'.*supported: default, linear, llama3"):
        model_args_from_hf(cfg)


def test_qwen2_has_qkv_bias_but_no_o_bias():
    cfg = {**SMOLLM2, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
           "sliding_window": 4096}
    a = model_args_from_hf(cfg)
    assert a.attention_bias and not a.o_proj_bias and a.sliding_window is None


def test_mistral_sliding_window_and_default_head_dim():
    cfg = {**SMOLLM2, "architectures": ["MistralForCausalLM"], "sliding_window": 4096}
    del cfg["head_dim"]
    a = model_args_from_hf(cfg)
    assert a.sliding_window == 4096 and a.head_dim == 576 // 9


def test_unknown_architecture_names_it_and_lists_supported():
    cfg = {**SMOLLM2, "architectures": ["GPTNeoXForCausalLM"]}
    with pytest.raises(ValueError) as err:
        model_args_from_hf(cfg)
    msg = str(err.value)
    assert "GPTNeoXForCausalLM" in msg
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert arch in msg


def test_generation_config_eos_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, "eos_token_id": 0}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert load_model_args(tmp_path).eos_token_ids == (2, 0)


def test_missing_config_json_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_args(tmp_path)


def test_bad_shapes_rejected():
    with pytest.raises(ValueError, match="multiple"):
        ModelArgs(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1,
                  num_heads=3, num_kv_heads=2, head_dim=4)
