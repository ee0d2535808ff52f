"""Building an EngineConfig from YAML (the seed's shape), flat dicts and settings given
by name (`ConfigOverrides`: what the CLI's vLLM-style flags become).

Accepted YAML shapes, mixed freely:

    scheduler: {max_num_seqs: 40, max_num_batched_tokens: 8192}
    queue: {max_waiting: 24, aging_after_s: 20}
    replicas: 3
    max_num_batched_tokens: 8192      # flat keys go to the section that owns them
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepserve.cli_errors import UsageError
from stepserve.config import SECTIONS, ConfigError, EngineConfig
from stepserve.user_files import load_yaml

TOP_LEVEL = ("replicas", "router")


def _owner_of(key: str) -> str | None:
    """Which section owns a flat key."""
    for section, cls in SECTIONS.items():
        if key in {f.name for f in dataclasses.fields(cls)}:
            return section
    return None


def _all_keys() -> list[str]:
    keys = list(TOP_LEVEL)
    for cls in SECTIONS.values():
        keys += [f.name for f in dataclasses.fields(cls)]
    return keys


def apply_flat(base: EngineConfig, changes: dict[str, Any]) -> EngineConfig:
    """Apply {key: value} where keys are field names of any section or top-level."""
    nested: dict[str, Any] = {}
    for key, value in changes.items():
        if key in TOP_LEVEL:
            nested[key] = value
            continue
        section = _owner_of(key)
        if section is None:
            raise ConfigError(f"unknown setting {key!r}; known settings: {', '.join(_all_keys())}")
        nested.setdefault(section, {})[key] = value
    return apply_nested(base, nested)


def apply_nested(base: EngineConfig, data: dict[str, Any]) -> EngineConfig:
    """Apply a YAML-shaped dict (sections and/or flat keys) on top of `base`."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of settings, got {type(data).__name__}")
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: must be a mapping of settings, got {value!r}")
            cls = SECTIONS[key]
            names = {f.name for f in dataclasses.fields(cls)}
            for sub in value:
                if sub not in names:
                    raise ConfigError(
                        f"unknown setting {key}.{sub}; allowed in {key}: {', '.join(sorted(names))}")
            sections.setdefault(key, {}).update(value)
        elif key in TOP_LEVEL:
            top[key] = value
        else:
            flat[key] = value
    for key, value in flat.items():
        section = _owner_of(key)
        if section is None:
            raise ConfigError(f"unknown setting {key!r}; known settings: {', '.join(_all_keys())}")
        sections.setdefault(section, {})[key] = value
    kwargs: dict[str, Any] = dict(top)
    for section, values in sections.items():
        kwargs[section] = dataclasses.replace(getattr(base, section), **values)
    return dataclasses.replace(base, **kwargs)


def load_config(path: str | Path, base: EngineConfig | None = None) -> EngineConfig:
    """Read a YAML config file; every error names the file."""
    where = f"config file {str(path)!r}"
    try:
        data = load_yaml(path, "config file")
    except UsageError as e:
        raise ConfigError(str(e)) from None
    try:
        return apply_nested(base or EngineConfig(), {} if data is None else data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def to_dict(config: EngineConfig) -> dict[str, Any]:
    """The config as a YAML-shaped dict (what load_config reads back)."""
    out: dict[str, Any] = {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}
    out["replicas"] = config.replicas
    out["router"] = config.router
    return out


# ---- settings given by name (the CLI's vLLM-style flags build these) ----

def parse_bool(text: str) -> bool:
    """`true`/`false` (also 1/0, yes/no, on/off) as a bool; ValueError otherwise."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def config_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """Every setting as (section, field): the sections' fields, then the top-level ones
    (section ""). Each field's metadata holds its help text, kind, bounds and choices."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield section, f
    for f in dataclasses.fields(EngineConfig):
        if f.name in TOP_LEVEL:
            yield "", f


@dataclass(frozen=True)
class ConfigOverrides:
    """What a user gives on top of a base config: a YAML file, then settings by name
    ({"max_num_seqs": 40}, from flags). Applied in that order, so settings win."""

    config_file: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return bool(self.config_file or self.settings)

    def apply(self, base: EngineConfig | None = None) -> EngineConfig:
        """The config file (if any) on `base`, then the settings."""
        config = base or EngineConfig()
        if self.config_file:
            config = load_config(self.config_file, config)
        return self.apply_settings(config)

    def apply_settings(self, base: EngineConfig) -> EngineConfig:
        """Only the settings on `base` (a config that came from another file)."""
        return apply_flat(base, dict(self.settings)) if self.settings else base
