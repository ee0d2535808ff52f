"""The settings a simulation takes from the engine it predicts: an engine kind's preset
(sim/engine_kinds.py) and a target profile's inferred settings (profile/infer.py), under
the run's own settings and the command line's.

Each setting comes from the first of, highest first:

1. a flag or --config file (the user said it);
2. the run's own settings: a scenario run's values that differ from our defaults, or a
   --configs file's;
3. the target profile's inferred settings (`settings` of `stepserve.target-profile/1`),
   each with its confidence; one inferred only as a bound (`at_least`) or with low
   confidence is used and said so;
4. the engine kind's preset;
5. our defaults.

Two values from different layers can clash where our settings refuse the pair: a run's
long_prefill_token_threshold above a budget the profile inferred is clamped to the
budget, with a note (a chunk can never exceed the budget, so the cap it meant still
holds); a clash with a flag is refused, naming both values and what to pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepserve.config.load import ConfigOverrides, config_fields
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.sim.engine_kinds import PROFILE_ENGINES, STEPSERVE, EngineKind, get_engine_kind

# how sure a profile is of a setting it inferred (profile/infer.py's Inferred), surest first
CONFIDENCE = ("high", "medium", "low")

# a profile's inferred setting -> ours (kv_capacity_tokens becomes num_gpu_blocks at the
# run's block size)
PROFILE_SETTINGS = {"max_num_seqs": "max_num_seqs", "token_budget": "max_num_batched_tokens",
                    "chunked_prefill": "enable_chunked_prefill",
                    "prefix_caching": "enable_prefix_caching",
                    "kv_capacity_tokens": "num_gpu_blocks"}
_DEFAULTS = EngineConfig()
Note = tuple[str, str]  # (the run it is about, what it says)


def grouped(notes: list[Note]) -> list[str]:
    """One line per note, the runs it holds for in front ("A, B: ..."), in first order."""
    runs: dict[str, list[str]] = {}
    for run, text in notes:
        runs.setdefault(text, []).append(run)
    return [f"  {', '.join(names)}: {text}" for text, names in runs.items()]


@dataclass(frozen=True)
class InferredValue:
    value: Any
    confidence: str
    at_least: bool = False

    def shown(self) -> str:
        v = str(self.value).lower() if isinstance(self.value, bool) else str(self.value)
        return f">= {v}" if self.at_least else v


@dataclass(frozen=True)
class ProfileSettings:
    """What a target profile says of the engine: its kind (None: no /metrics) and its
    inferred settings, by the profile's names; `max_model_len` from /v1/models."""

    source: str
    engine: str | None
    inferred: dict[str, InferredValue]
    max_model_len: int | None = None

    @classmethod
    def from_json(cls, source: str, data: Mapping[str, Any]) -> ProfileSettings:
        """A target profile's `target` and `settings`; ValueError naming a bad field."""
        target = data.get("target") or {}
        settings = data.get("settings") or {}
        if not isinstance(target, dict) or not isinstance(settings, dict):
            raise ValueError("target profile: `target` and `settings` must be mappings")
        inferred = {}
        for name, item in settings.items():
            if name not in PROFILE_SETTINGS:
                continue  # another version's setting: not one we apply
            if not isinstance(item, dict):
                raise ValueError(f"target profile: settings.{name} must be a mapping")
            if item.get("value") is None:
                continue
            conf = item.get("confidence", "low")
            if conf not in CONFIDENCE:
                raise ValueError(f"target profile: settings.{name}.confidence {conf!r}: "
                                 f"allowed: {', '.join(CONFIDENCE)}")
            inferred[name] = InferredValue(item["value"], conf, bool(item.get("at_least")))
        engine = target.get("engine")
        max_len = target.get("max_model_len")
        return cls(source, engine if isinstance(engine, str) else None, inferred,
                   max_len if isinstance(max_len, int) and max_len > 0 else None)

    def default_kind(self) -> tuple[EngineKind, str | None]:
        """The kind the profile's engine names, and a note where it names none we have."""
        kind = PROFILE_ENGINES.get(self.engine or "")
        if kind is None:
            what = f"engine {self.engine!r}" if self.engine else "no engine (no /metrics)"
            return STEPSERVE, (f"{self.source} names {what}; no engine kind for it: "
                               "stepserve's scheduling rules (pass --engine-kind)")
        return get_engine_kind(kind), None

    def settings_for(self, block_size: int) -> dict[str, tuple[Any, InferredValue]]:
        """Our settings this profile gives: name -> (value, as inferred)."""
        out: dict[str, tuple[Any, InferredValue]] = {}
        for name, inf in self.inferred.items():
            ours = PROFILE_SETTINGS[name]
            value = inf.value // block_size if name == "kv_capacity_tokens" else inf.value
            out[ours] = (value, inf)
        if self.max_model_len is not None:
            out["max_model_len"] = (self.max_model_len,
                                    InferredValue(self.max_model_len, "high"))
        return out


@dataclass(frozen=True)
class TargetLayers:
    """The kind and the profile beneath a simulation's runs (`config_for`)."""

    kind: EngineKind = STEPSERVE
    profile: ProfileSettings | None = None
    kind_note: str | None = None  # why the kind is what it is, where not asked for

    @property
    def active(self) -> bool:
        return self.profile is not None or self.kind is not STEPSERVE

    def config_for(self, own: EngineConfig, flags: ConfigOverrides, run: str = "run"
                   ) -> tuple[EngineConfig, list[Note]]:
        """`own` (a run's config) over the profile over the kind, the flags on top; and
        the notes: what came from where, and any clash resolved."""
        if not self.active:
            return flags.apply(own), []
        config = self.kind.base_config()
        own_changes = _changes(_DEFAULTS, own)
        notes: list[Note] = []
        from_profile: dict[str, InferredValue] = {}
        if self.profile is not None:
            block = _block_size(config, own_changes, flags)
            given = self.profile.settings_for(block)
            kept = {k: v for k, (v, _) in given.items()
                    if k not in own_changes and not flags.sets(k)}
            config = _replace(config, kept, f"{self.profile.source}'s inferred settings")
            from_profile = {k: given[k][1] for k in kept}
            notes += _profile_notes(self.profile, given, kept, own_changes, flags, run)
        own_changes = _clamp_threshold(config, own_changes, from_profile, notes, run)
        config = _replace(config, own_changes, f"run {run}'s own settings")
        try:
            config = flags.apply(config)
        except ConfigError as e:
            raise ConfigError(_clash(str(e), from_profile, self)) from None
        return config, notes

    def describe(self) -> list[str]:
        lines = [f"engine kind: {self.kind.name}"
                 + (f" ({self.kind_note})" if self.kind_note else "")]
        lines += [f"  approximation: {a}" for a in self.kind.approximations]
        return lines


NO_LAYERS = TargetLayers()  # our own engine: runs as they are


def target_layers(kind: str | None, profile: ProfileSettings | None) -> TargetLayers:
    """`--engine-kind` (None: the profile's engine, else stepserve) and the profile."""
    if kind is not None:
        return TargetLayers(get_engine_kind(kind), profile)
    if profile is not None:
        found, note = profile.default_kind()
        return TargetLayers(found, profile, note or f"from {profile.source}")
    return NO_LAYERS


def _block_size(config: EngineConfig, own: dict[str, Any], flags: ConfigOverrides) -> int:
    """The block size the run will have: the profile's KV capacity is counted in it."""
    if flags.sets("block_size"):
        try:
            return flags.apply(config).cache.block_size
        except ConfigError:
            pass  # the clash is reported once the layers are applied
    return own.get("block_size", config.cache.block_size)


def _changes(before: EngineConfig, after: EngineConfig) -> dict[str, Any]:
    def value(config: EngineConfig, section: str, name: str) -> Any:
        return getattr(getattr(config, section) if section else config, name)

    return {f.name: value(after, s, f.name) for s, f in config_fields()
            if value(before, s, f.name) != value(after, s, f.name)}


def _replace(config: EngineConfig, changes: dict[str, Any], whose: str) -> EngineConfig:
    if not changes:
        return config
    try:
        return config.replace(**changes)
    except ConfigError as e:
        raise ConfigError(f"{whose}: {e}") from None


def _clamp_threshold(config: EngineConfig, own: dict[str, Any],
                     from_profile: Mapping[str, InferredValue], notes: list[Note],
                     run: str) -> dict[str, Any]:
    """A run's long_prefill_token_threshold above the profile's budget, clamped to it."""
    threshold = own.get("long_prefill_token_threshold")
    budget = config.scheduler.max_num_batched_tokens
    if threshold is None or "max_num_batched_tokens" not in from_profile or \
            "max_num_batched_tokens" in own or threshold <= budget:
        return own
    notes.append((run, f"its long_prefill_token_threshold {threshold} is above the "
                  f"target's max_num_batched_tokens {budget}: clamped to {budget} (no "
                  f"chunk exceeds the budget; pass --max-num-batched-tokens {threshold} "
                  "to keep the run's threshold)"))
    return {**own, "long_prefill_token_threshold": budget}


def _clash(message: str, from_profile: Mapping[str, InferredValue],
           layers: TargetLayers) -> str:
    """A flag refused over the profile's values: which of the values came from where."""
    named = [f"{name} = {inf.shown()} came from {layers.profile.source} ({inf.confidence}); "
             f"pass --{name.replace('_', '-')} to set it"
             for name, inf in from_profile.items() if name in message and layers.profile]
    return message + (f" ({'; '.join(named)})" if named else "")


def _profile_notes(profile: ProfileSettings, given: dict[str, tuple[Any, InferredValue]],
                   kept: dict[str, Any], own: dict[str, Any], flags: ConfigOverrides,
                   run: str) -> list[Note]:
    lines: list[Note] = []
    for name, (value, inf) in given.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if name in kept:
            caveat = []
            if inf.at_least:
                caveat.append(f"inferred only as a lower bound ({inf.shown()}): used as is")
            if inf.confidence == "low":
                caveat.append("low confidence: check it on the server")
            how = f"{text} ({inf.confidence})" + (f"; {'; '.join(caveat)}" if caveat else "")
            if name == "num_gpu_blocks":
                how += f", from kv_capacity_tokens {inf.shown()}"
            lines.append((run, f"{name} {how}"))
        else:
            by = "the command line's" if flags.sets(name) else f"the run's own {own.get(name)}"
            lines.append((run, f"{name} {text} not used: {by} wins"))
    return lines
