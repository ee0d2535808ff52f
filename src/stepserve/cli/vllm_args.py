"""The command line read as vLLM's FlexibleArgumentParser reads it, before argparse:

* `--max_num_seqs 40` is `--max-num-seqs 40`: underscores in a flag's name read as
  dashes (its value is left alone);
* `--config FILE.yaml` may be a vLLM-style file of flat keys (`max-num-seqs: 40`,
  `port: 8000`, `seed: 0`): a key that is an engine setting (or a section of our nested
  shape) stays for the config loader, any other key that names one of the command's
  flags becomes that flag, placed before the command line's own flags so that those
  override it, as in vLLM. A key that is neither is refused, naming the file.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from stepserve.config.errors import UsageError
from stepserve.config.load import TOP_LEVEL, config_fields, setting_name
from stepserve.config.settings import SECTIONS
from stepserve.config.user_files import load_yaml

COMMAND_KEYS_DEST = "config_command_keys"  # the file's keys read as flags (not settings)
CONFIG_PROBLEM_DEST = "config_file_problem"  # a UsageError the command reports


def dashed_flags(argv: Sequence[str]) -> list[str]:
    """`--a_b[=v]` as `--a-b[=v]`; everything after a bare `--` as it is."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        if arg.startswith("--") and "_" in arg.partition("=")[0]:
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def _config_path(argv: Sequence[str]) -> str | None:
    """The value of the last `--config` in argv, if any."""
    path = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
    return path


def _is_setting(key: str) -> bool:
    name = setting_name(key)
    return name in SECTIONS or name in TOP_LEVEL or \
        any(f.name == name for _s, f in config_fields())


def config_file_flags(parser: argparse.ArgumentParser, argv: Sequence[str]
                      ) -> tuple[list[str], frozenset[str]]:
    """The flags a vLLM-style `--config` file in argv gives the command (to go before
    argv), and its keys read that way (our names; the config loader skips them)."""
    path = _config_path(argv)
    if path is None:
        return [], frozenset()
    data = load_yaml(path, "config file")
    if not isinstance(data, dict):
        return [], frozenset()  # the config loader names the problem
    options = parser._option_string_actions  # noqa: SLF001 (argparse has no public map)
    flags: list[str] = []
    keys: set[str] = set()
    for key, value in data.items():
        key = str(key)
        if _is_setting(key):
            continue
        flag = "--" + key.replace("_", "-")
        action = options.get(flag)
        if action is None or flag == "--config":
            raise UsageError(f"config file {path!r}: unknown key {key!r}: neither an engine "
                             f"setting nor a flag of `{parser.prog}`")
        flags += _tokens(flag, value, action, options, path)
        keys.add(setting_name(key))
    return flags, frozenset(keys)


def _tokens(flag: str, value: Any, action: argparse.Action,
            options: dict[str, argparse.Action], path: str) -> list[str]:
    """`key: value` of a config file as command-line tokens for `flag`."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if isinstance(action, argparse._AppendAction):  # noqa: SLF001
            return [f"{flag}={v}" for v in value]
        if len(value) != 1:
            raise UsageError(f"config file {path!r}: {flag[2:]} takes one value, got "
                             f"{len(value)}")
        value = value[0]
    if isinstance(value, dict):
        raise UsageError(f"config file {path!r}: {flag[2:]} takes a value, not a mapping")
    if isinstance(value, bool):
        if action.nargs == 0:  # a switch: --flag, or its --no-flag where there is one
            if value == bool(action.const):
                return [flag]
            negated = "--no-" + flag[2:]
            return [negated] if negated in options else []
        value = "true" if value else "false"
    return [f"{flag}={value}"]
