"""The engine settings as vLLM-style flags (`--max-num-seqs 40`,
`--no-enable-chunked-prefill`), one per config field, with the field's help text and
choices; shared by generate, serve, simulate, bench and sweep."""

from __future__ import annotations

import argparse
from typing import Any

from stepserve.config import EngineConfig
from stepserve.config_load import ConfigOverrides, config_fields, parse_bool
from stepserve.model.modes import QUANTIZATION_CHOICES  # torch-free


def bool_flag(text: str) -> bool:
    """argparse's type for a true/false flag value: its message is shown as is."""
    try:
        return parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per config field; defaults are None so only given flags apply."""
    group = parser.add_argument_group("engine settings (vLLM-style flags; override --config)")
    for _section, f in config_fields():
        meta = f.metadata
        flag = "--" + f.name.replace("_", "-")
        kind = meta["kind"]
        if kind is bool:
            group.add_argument(flag, dest=f.name, type=bool_flag, nargs="?", const=True,
                               default=None, help=meta["help"])
            group.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                               action="store_false", help=argparse.SUPPRESS)
        else:
            group.add_argument(flag, dest=f.name, type=kind, default=None,
                               choices=meta["choices"], help=meta["help"])


def flag_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings given as flags (add_config_arguments), {name: value}."""
    return {f.name: getattr(args, f.name) for _s, f in config_fields()
            if getattr(args, f.name, None) is not None}


def config_overrides(args: argparse.Namespace) -> ConfigOverrides:
    """--config FILE (where the command has it) and the engine flags given."""
    return ConfigOverrides(getattr(args, "config", None), flag_changes(args))


def config_from_args(args: argparse.Namespace, base: EngineConfig | None = None) -> EngineConfig:
    """Config file (args.config, if any) then any flags given on top."""
    return config_overrides(args).apply(base)


# ---- --quantization ----

def add_quantization_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES,
                        help="weight mode: auto (the GGUF's own Q4_1 groups through "
                             "stepserve's kernels where the model has a GGUF and the CPU "
                             "runs them, else float), none (float weights at --dtype), "
                             "q4_1, int4 (torch int4pack), int8 (torch int8pack); see "
                             "docs/guide.md")
