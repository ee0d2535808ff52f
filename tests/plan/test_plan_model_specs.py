import dataclasses

import pytest

from stepserve.plan.model_specs import ModelSpec, get_model_spec, list_model_specs

TIED_EMBEDDINGS = {"smollm2-135m", "smollm2-360m", "qwen2.5-0.5b"}


def test_fields_are_the_agreed_interface():
    names = [f.name for f in dataclasses.fields(ModelSpec)]
    assert names == [
        "name",
        "num_params",
        "num_layers",
        "hidden_size",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "dtype_bytes",
        "vocab_size",
        "intermediate_size",
    ]


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [
        ("llama-3-8b", 131_072),  # 128 KiB
        ("qwen2.5-7b", 57_344),  # 56 KiB
        ("smollm2-135m", 23_040),
        ("qwen2.5-14b", 196_608),  # 192 KiB, the promo-spike incident's figure
        ("llama-3-70b", 327_680),
        ("mistral-7b", 131_072),
        ("llama-2-13b", 819_200),
    ],
)
def test_kv_bytes_per_token(name, kv_bytes):
    assert get_model_spec(name).kv_bytes_per_token == kv_bytes


def test_smollm2_135m_matches_design():
    s = get_model_spec("smollm2-135m")
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim) == (
        30,
        576,
        9,
        3,
        64,
    )
    assert s.vocab_size == 49_152
    assert round(s.num_params / 1e6, 1) == 134.5


@pytest.mark.parametrize("spec", list_model_specs(), ids=lambda s: s.name)
def test_param_count_follows_from_shape(spec):
    """The stored count equals what the shape gives for a Llama/Qwen2 decoder."""
    h, kv_width = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    q_width = spec.num_heads * spec.head_dim
    attention = h * q_width + 2 * h * kv_width + q_width * h
    if spec.name.startswith("qwen2"):
        attention += q_width + 2 * kv_width  # q/k/v bias
    layer = attention + 3 * h * spec.intermediate_size + 2 * h
    embeddings = spec.vocab_size * h * (1 if spec.name in TIED_EMBEDDINGS else 2)
    assert spec.num_layers * layer + embeddings + h == spec.num_params
    assert spec.weight_bytes == 2 * spec.num_params


def test_lookup():
    assert get_model_spec("LLaMA-3-8B").name == "llama-3-8b"
    with pytest.raises(ValueError) as info:
        get_model_spec("gpt-5")
    assert "gpt-5" in str(info.value) and "llama-3-8b" in str(info.value)


def test_list_is_sorted_and_frozen():
    specs = list_model_specs()
    assert [s.num_params for s in specs] == sorted(s.num_params for s in specs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs[0].num_layers = 1
