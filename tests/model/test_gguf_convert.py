"""The fast GGUF conversion (gguf_convert.py) against the slow authorities:
gguf-py's reader for what the file holds, the tiny GGUF's float32 reference for the
dequantised, un-permuted weights, transformers' GGUF loader for the config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from stepserve.model.gguf_convert import (
    find_smollm2_gguf,
    llama_config,
    read_gguf,
    write_float_weights,
)

gguf = pytest.importorskip("gguf")


def test_reader_reads_what_gguf_py_reads(gguf_dir):
    path = gguf_dir.parent / "tiny.gguf"
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert ours.architecture == "llama"
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.type_name == t.tensor_type.name
        assert mine.shape == tuple(int(d) for d in reversed(t.shape))
        assert mine.data.shape == t.data.shape and np.array_equal(mine.data, t.data)


def test_string_arrays_and_scalars_of_the_default_gguf():
    path = find_smollm2_gguf()
    meta = read_gguf(path).metadata
    tokens, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"]
    assert len(tokens) == meta["llama.vocab_size"] == 49152
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(len(m.split(" ")) == 2 for m in merges[:1000])
    assert meta["llama.block_count"] == 30 and meta["llama.rope.freq_base"] == 100000.0


def test_float_weights_are_the_reference_bits(gguf_dir, tmp_path):
    """The tiny GGUF holds Q4_1, Q8_0 and F32 tensors with Q/K rows permuted; the reference
    directory holds gguf-py's dequantisation of them, un-permuted."""
    config = json.loads((gguf_dir / "config.json").read_text())
    out = tmp_path / "w.safetensors"
    write_float_weights(read_gguf(gguf_dir.parent / "tiny.gguf"),
                        config["num_attention_heads"], config["num_key_value_heads"], out)
    ours, reference = load_file(str(out)), load_file(str(gguf_dir / "model.safetensors"))
    assert set(ours) == set(reference)
    for name, want in reference.items():
        assert ours[name].dtype == torch.float32
        assert torch.equal(ours[name], want), name


def test_config_is_what_transformers_makes_of_the_gguf():
    transformers = pytest.importorskip("transformers")
    path = find_smollm2_gguf()
    theirs = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = transformers.AutoConfig.for_model("llama", **llama_config(read_gguf(path)))
    # what saving a model adds (its class and dtype) and where it was read from
    skip = {"transformers_version", "_name_or_path", "architectures", "dtype"}
    a, b = ours.to_dict(), theirs.to_dict()
    assert {k: v for k, v in a.items() if k not in skip} == \
        {k: v for k, v in b.items() if k not in skip}
    assert a["architectures"] == ["LlamaForCausalLM"] and a["dtype"] == "float32"
