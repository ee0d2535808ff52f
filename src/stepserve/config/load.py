"""An EngineConfig from YAML, flat dicts and settings given by name (`ConfigOverrides`:
what the CLI's vLLM-style flags become). YAML shapes, mixed freely:

    scheduler: {max_num_seqs: 40, max_num_batched_tokens: 8192}
    queue: {max_waiting: 24, aging_after_s: 20}
    replicas: 3
    max_num_batched_tokens: 8192      # flat keys go to the section that owns them
    max-num-seqs: 40                  # vLLM's spelling: dashes, and its names
    num-gpu-blocks-override: 512      #   (VLLM_ALIASES) for settings we name otherwise
    kv-cache-memory-bytes: 4GiB       # sizes as text, as vLLM reads them (4G too)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.settings import SECTIONS, ConfigError, EngineConfig
from stepserve.config.sizes import parse_count, parse_size
from stepserve.config.user_files import load_yaml, preview

TOP_LEVEL = ("replicas", "router", "threads")
# vLLM's names of settings we name otherwise (its flags and config-file keys)
VLLM_ALIASES = {"num_gpu_blocks_override": "num_gpu_blocks",
                "kv_cache_memory_bytes": "kv_cache_memory",
                "scheduling_policy": "policy",
                "device_memory_utilization": "gpu_memory_utilization"}


def setting_name(key: str) -> str:
    """Our name for a setting as a YAML key or flag spells it (`max-num-seqs`, vLLM's)."""
    key = key.replace("-", "_")
    return VLLM_ALIASES.get(key, key)


def _model_len(text: str | int) -> int | None:
    """vLLM's --max-model-len: a count (32k, 32K); -1 or auto: unset, so the default
    applies (the model's own length where it is shorter)."""
    if text == -1 or (isinstance(text, str) and text.strip().lower() in ("-1", "auto")):
        return None
    return parse_count(text)


# vLLM's names of hash algorithms that serialise a block's key with CBOR before hashing
# (so that other languages can recompute them): the blocks named, and shared, are the
# same, and no name leaves the process, so each is its plain algorithm here
_CBOR_HASHES = {"sha256_cbor": "sha256", "xxhash_cbor": "xxhash"}

# settings that may be given as text, and how that text reads (None: left unset)
TEXT_VALUES = {"kv_cache_memory": functools.partial(parse_size, one_letter=True),
               "max_model_len": _model_len,
               "max_num_batched_tokens": parse_count,
               "long_prefill_token_threshold": parse_count,
               "prefix_caching_hash_algo": lambda text: _CBOR_HASHES.get(text, text)}


def config_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """Every setting as (section, field), the top-level ones (section "") last."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield section, f
    for f in dataclasses.fields(EngineConfig):
        if f.name in TOP_LEVEL:
            yield "", f


# which section owns each setting ("": the top level), in the order messages list them
OWNER = {name: "" for name in TOP_LEVEL} | {f.name: s for s, f in config_fields() if s}


def _value_of(key: str, value: Any) -> Any:
    """A YAML value as the setting takes it (a size as text in bytes)."""
    reader = TEXT_VALUES.get(key)
    if reader is None or not isinstance(value, str):
        return value
    try:
        return reader(value)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def settings_given(data: Any, skip: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """The settings a YAML-shaped dict gives (sections and/or flat keys, either spelling),
    by owning section ("": the top level); a flat key wins over its section's entry.
    `skip`: top-level keys (our names) that are another reader's (a command's own flags
    in a vLLM-style file, read by the CLI)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of settings, got {type(data).__name__}")
    changes: dict[str, dict[str, Any]] = {}
    for raw_key, value in sorted(data.items(), key=lambda kv: str(kv[0]) not in SECTIONS):
        key = setting_name(str(raw_key))
        if key in skip:
            continue
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: must be a mapping of settings, got {preview(value)}")
            names = [name for name, owner in OWNER.items() if owner == key]
            for sub, v in value.items():
                sub = setting_name(str(sub))
                if sub not in names:
                    raise ConfigError(f"unknown setting {key}.{sub}; allowed in {key}: "
                                      f"{', '.join(sorted(names))}")
                if (read := _value_of(sub, v)) is not None or sub not in TEXT_VALUES:
                    changes.setdefault(key, {})[sub] = read
        elif key in OWNER:
            read = value if key in TOP_LEVEL else _value_of(key, value)
            if read is not None or key not in TEXT_VALUES:  # "auto": the default
                changes.setdefault(OWNER[key], {})[key] = read
        else:
            raise ConfigError(f"unknown setting {preview(key)}; known settings: "
                              f"{', '.join(OWNER)}")
    return changes


def apply_nested(base: EngineConfig, data: Any,
                 skip: frozenset[str] = frozenset()) -> EngineConfig:
    """`base` with the settings of a YAML-shaped dict (settings_given) applied."""
    changes = settings_given(data, skip)
    kwargs = changes.pop("", {})
    for section, values in changes.items():
        kwargs[section] = dataclasses.replace(getattr(base, section), **values)
    return dataclasses.replace(base, **kwargs)


def load_config(path: str | Path, base: EngineConfig | None = None,
                skip: frozenset[str] = frozenset()) -> EngineConfig:
    """Read a YAML config file; every error names the file. `skip`: see settings_given."""
    try:
        data = load_yaml(path, "config file")
    except UsageError as e:
        raise ConfigError(str(e)) from None
    try:
        return apply_nested(base or EngineConfig(), {} if data is None else data, skip)
    except ConfigError as e:
        raise ConfigError(f"config file {str(path)!r}: {e}") from None


def to_dict(config: EngineConfig) -> dict[str, Any]:
    """The config as a YAML-shaped dict (what load_config reads back)."""
    return {**{name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS},
            **{name: getattr(config, name) for name in TOP_LEVEL}}


# ---- settings given by name (the CLI's vLLM-style flags build these) ----

def parse_bool(text: str) -> bool:
    """`true`/`false` (also 1/0, yes/no, on/off) as a bool; ValueError otherwise."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {preview(text)}")


@dataclass(frozen=True)
class ConfigOverrides:
    """A YAML file, then settings by name ({"max_num_seqs": 40}, from flags), applied in
    that order on a base config, so settings win."""

    config_file: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    # keys of the file that are the command's own flags (port, seed), not settings
    command_keys: frozenset[str] = frozenset()

    @property
    def given(self) -> bool:
        return bool(self.config_file or self.settings)

    def apply(self, base: EngineConfig | None = None) -> EngineConfig:
        config = base or EngineConfig()
        if self.config_file:
            config = load_config(self.config_file, config, self.command_keys)
        return self.apply_settings(config)

    def sets(self, name: str) -> bool:
        """Whether the user chose setting `name` (a flag, or a key of the file)."""
        if name in {setting_name(k) for k in self.settings}:
            return True
        if not self.config_file:
            return False
        data = load_yaml(self.config_file, "config file")
        given = settings_given({} if data is None else data, self.command_keys)
        return any(name in names for names in given.values())

    def apply_settings(self, base: EngineConfig) -> EngineConfig:
        return apply_nested(base, dict(self.settings)) if self.settings else base
