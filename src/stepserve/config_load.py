"""Building an EngineConfig from YAML (the seed's shape), flat dicts and CLI flags.

Accepted YAML shapes, mixed freely:

    scheduler: {max_num_seqs: 40, max_num_batched_tokens: 8192}
    queue: {max_waiting: 24, aging_after_s: 20}
    replicas: 3
    max_num_batched_tokens: 8192      # flat keys go to the section that owns them
"""

from __future__ import annotations

import argparse
import dataclasses
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


# ---- CLI flags, vLLM style: --max-num-seqs 40 --no-enable-chunked-prefill ----

def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _fields_with_meta():
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield section, f
    for f in dataclasses.fields(EngineConfig):
        if f.name in TOP_LEVEL:
            yield "", f


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per config field; defaults are None so only given flags apply."""
    group = parser.add_argument_group("engine settings (vLLM-style flags; override --config)")
    for _section, f in _fields_with_meta():
        meta = f.metadata
        flag = "--" + f.name.replace("_", "-")
        kind = meta["kind"]
        if kind is bool:
            group.add_argument(flag, dest=f.name, type=_parse_bool, nargs="?", const=True,
                               default=None, help=meta["help"])
            group.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                               action="store_false", help=argparse.SUPPRESS)
        else:
            group.add_argument(flag, dest=f.name, type=kind, default=None,
                               choices=meta["choices"], help=meta["help"])


def flag_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings given as flags (add_config_arguments), {name: value}."""
    return {f.name: getattr(args, f.name) for _s, f in _fields_with_meta()
            if getattr(args, f.name, None) is not None}


def config_from_args(args: argparse.Namespace, base: EngineConfig | None = None) -> EngineConfig:
    """Config file (args.config, if any) then any flags given on top."""
    config = base or EngineConfig()
    path = getattr(args, "config", None)
    if path:
        config = load_config(path, config)
    changes = flag_changes(args)
    return apply_flat(config, changes) if changes else config
