"""The default sampling params a model recommends in its generation_config.json, taken
as vLLM's `--generation-config` takes them: `auto` (vLLM's default) reads the model
folder's file, `vllm` reads none (vLLM's own defaults: temperature 1, top_p 1, ...), a
folder reads that folder's file; `--override-generation-config` goes over either. Only
the keys vLLM reads count: temperature, top_p, top_k, min_p, repetition_penalty, and
max_new_tokens, a cap on every request's max_tokens. A request's own field wins over its
default; a field the request leaves out takes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.validate import Allowed
from stepserve.core import request_limits as limits

FILE = "generation_config.json"
# each default's range: the one the API allows for the request field it stands for
RANGES = {
    "temperature": Allowed(0.0, limits.TEMPERATURE_MAX, float),
    "top_p": Allowed(0.0, 1.0, float, lo_open=True),
    "top_k": Allowed(-1, limits.TOP_K_MAX, int, note=" (0 or -1: off)"),
    "min_p": Allowed(0.0, 1.0, float),
    "repetition_penalty": Allowed(0.0, limits.REPETITION_PENALTY_MAX, float, lo_open=True),
    "max_new_tokens": Allowed(1, limits.MAX_TOKENS_MAX, int),
}


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults for the sampling fields a request leaves out (None: vLLM's own)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None  # generation_config's max_new_tokens: caps every request
    source: str = "vllm"  # where they came from, for the startup line

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "source" and getattr(self, f.name) is not None}

    def describe(self) -> str:
        given = self.given()
        if not given:
            return f"sampling defaults: {self.source}"
        shown = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in given.items())
        return f"sampling defaults from {self.source}: {shown}"


def sampling_defaults(choice: str, model_dir: str | Path,
                      overrides: Mapping[str, Any] | None = None) -> SamplingDefaults:
    """The defaults `--generation-config choice` gives for the model in `model_dir`, with
    `overrides` (--override-generation-config) over them. UsageError, naming the file or
    flag, the key and what it allows, for a value a request could not give either."""
    if choice == "vllm":
        found: dict[str, Any] = {}
        source = "vLLM's own (--generation-config vllm)"
    else:
        folder = Path(model_dir) if choice == "auto" else Path(choice).expanduser()
        path = folder / FILE
        if choice != "auto" and not path.is_file():
            raise UsageError(f"--generation-config {choice!r}: no {FILE} in that folder; "
                             "give a folder holding one, auto (the model's) or vllm")
        found = _read(path) if path.is_file() else {}
        found = {key: found[key] for key in RANGES if found.get(key) is not None}
        _check(found, str(path))
        source = str(path) if found else \
            f"vLLM's own ({path} names none)" if path.is_file() else \
            f"vLLM's own (the model has no {FILE})"
    if overrides:
        unknown = sorted(set(overrides) - set(RANGES))
        if unknown:
            raise UsageError(f"--override-generation-config: {unknown[0]!r} is not a "
                             f"sampling default; allowed: {', '.join(RANGES)}")
        chosen = {k: v for k, v in overrides.items() if v is not None}
        _check(chosen, "--override-generation-config")
        found |= chosen
        source += " and --override-generation-config"
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    return SamplingDefaults(**found, source=source)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read it as JSON: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must hold a JSON object, not {type(data).__name__}")
    return data


def _check(values: Mapping[str, Any], where: str) -> None:
    for key, value in values.items():
        if problem := RANGES[key].problem(key, value):
            raise UsageError(f"{where}: {problem}")
