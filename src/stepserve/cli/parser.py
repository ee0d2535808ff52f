"""The parser every command shares: a mistake is one line and exit status 2, every
flag's help shows its default, and the command line is read as vLLM's
FlexibleArgumentParser reads it: `--max_num_seqs` is `--max-num-seqs`, and a vLLM-style
`--config FILE.yaml` of flat keys leaves the engine settings (`max-num-seqs: 40`) to the
config loader and turns any other key (`port: 8000`) into the command's flag of that
name, before the command line's own so that those win; a key that is neither is refused.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from stepserve.cli.vllm_serve_flags import check_vllm_flags
from stepserve.config.errors import UsageError, one_line, report_error
from stepserve.config.limits import Range, check_flags
from stepserve.config.load import OWNER, setting_name
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


def config_file_flags(parser: argparse.ArgumentParser, argv: Sequence[str]
                      ) -> tuple[list[str], frozenset[str]]:
    """The flags a vLLM-style `--config` file in argv gives the command (to go before
    argv), and its keys read that way (our names; the config loader skips them)."""
    only_config = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    only_config.add_argument("--config", nargs="?")
    path = only_config.parse_known_args(argv)[0].config  # the last one given
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
        if setting_name(key) in SECTIONS or setting_name(key) in OWNER:
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
    """`key: value` of a config file as command-line tokens for `flag`: a list as the
    flag's values (or its repeats), a mapping as JSON (vLLM's JSON-valued flags)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if isinstance(action, argparse._AppendAction):  # noqa: SLF001 (extend too)
            return [f"{flag}={v}" for v in value]
        if action.nargs in ("+", "*") and value:
            return [flag, *(_text_of(v) for v in value)]
        if len(value) != 1:
            raise UsageError(f"config file {path!r}: {flag[2:]} takes one value, got "
                             f"{len(value)}")
        value = value[0]
    if isinstance(value, dict):
        if action.nargs == 0:
            raise UsageError(f"config file {path!r}: {flag[2:]} is a switch, not a mapping")
        return [f"{flag}={json.dumps(value)}"]
    if isinstance(value, bool):
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if value else "--no-" + flag[2:]]
        if action.nargs == 0:  # a switch: --flag, or its --no-flag where there is one
            if value == bool(action.const):
                return [flag]
            negated = "--no-" + flag[2:]
            return [negated] if negated in options else []
        value = "true" if value else "false"
    return [f"{flag}={_text_of(value)}"]


def _text_of(value: Any) -> str:
    """A YAML scalar or mapping as the command line writes it."""
    return json.dumps(value) if isinstance(value, dict) else str(value)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default (as argparse's ArgumentDefaultsHelpFormatter
    does), unless the text already says it: "(default: 600)", "(default: off)" for a
    switch, "(default: none)" for a flag that is unset unless given; a flag without help
    gets just that. A flag that must be given (required, or one of a required choice,
    `chosen`) has no default to show."""

    chosen: frozenset[int] = frozenset()  # ids of the actions of required groups

    def _default(self, action: argparse.Action) -> str | None:
        if (not action.option_strings or action.required or id(action) in self.chosen
                or action.default is argparse.SUPPRESS
                or "default" in (action.help or "").lower()):
            return None
        if action.nargs == 0:  # a switch: given or not
            return "(default: off)"
        if action.default is None or action.default == []:
            return "(default: none)"
        return "(default: %(default)s)"

    def _get_help_string(self, action: argparse.Action) -> str:
        text, default = action.help or "", self._default(action)
        return f"{text} {default}" if default else text

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and (default := self._default(action)):
            action = copy.copy(action)
            action.help = default
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (argparse prints the whole usage first: for
    `serve`, 30 lines before the one that matters). Subcommand parsers are of the same
    class (add_subparsers uses the parent's type), so they share the formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        formatter = super()._get_formatter()
        if isinstance(formatter, DefaultsHelpFormatter):
            formatter.chosen = frozenset(id(a) for g in self._mutually_exclusive_groups
                                         if g.required for a in g._group_actions)
        return formatter

    def _lists_beside_an_optional_positional(self) -> bool:
        """Whether an option takes a list while a positional may be left out (the case
        plain argparse parses wrongly; a parser with subcommands never is one)."""
        actions = self._actions
        return (not any(isinstance(a, argparse._SubParsersAction) for a in actions)
                and any(a.option_strings and a.nargs in ("+", "*") for a in actions)
                and any(not a.option_strings and a.nargs == "?" for a in actions))

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} "
                     f"--help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        """vLLM's habits first: `--max_num_seqs`, and a flat `--config` file's keys as
        flags that the command line overrides."""
        if getattr(self, "_intermixing", False):  # the two passes below
            return super().parse_known_args(args, namespace)
        argv = dashed_flags(sys.argv[1:] if args is None else list(args))
        # vLLM's `--help=all` (or =ModelConfig, =max-num-seqs): our whole help
        end = argv.index("--") if "--" in argv else len(argv)
        argv = [*("--help" if a.startswith("--help=") else a for a in argv[:end]),
                *argv[end:]]
        keys: frozenset[str] = frozenset()
        problem = None
        if "--config" in self._option_string_actions:
            try:
                flags, keys = config_file_flags(self, argv)
                argv = flags + argv
            except UsageError as e:  # reported by the command (`error: ...`, exit 2)
                problem = e
        if self._lists_beside_an_optional_positional():
            # `--served-model-name a b --port 1` with `serve [MODEL]`: plain argparse gives
            # `b` to MODEL; options first, then positionals, keeps both names a list
            self._intermixing = True
            try:
                ns, extras = self.parse_known_intermixed_args(argv, namespace)
            finally:
                self._intermixing = False
        else:
            ns, extras = super().parse_known_args(argv, namespace)
        if keys:
            setattr(ns, COMMAND_KEYS_DEST, keys)
        if problem is not None:
            setattr(ns, CONFIG_PROBLEM_DEST, problem)
        return ns, extras


def add_command(subparsers: Any, name: str, handler: Callable[[argparse.Namespace], int],
                ranges: Mapping[str, Range] | None = None, **kwargs: Any
                ) -> argparse.ArgumentParser:
    """Add subcommand `name`, run by `handler` once the numeric flags in `ranges` (keyed by
    dest; engine settings bound their own) are checked. A UsageError, raised anywhere
    below, is `error: ...` and exit 2, whether `main()` or a test calls the handler."""
    p = subparsers.add_parser(name, **kwargs)

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            check_flags(args, ranges or {})
            for warning in check_vllm_flags(args):  # vLLM's flags without effect here
                print(warning, file=sys.stderr)
            return handler(args)
        except UsageError as e:
            return report_error(e)

    p.set_defaults(func=run)
    return p


Options = TypeVar("Options")


def options_from(cls: type[Options], args: object, **fields: Any) -> Options:
    """An options dataclass from the flags (or another options object's fields) named as
    its fields, then `fields`: those named otherwise or that need converting."""
    names = {f.name for f in dataclasses.fields(cls)} - fields.keys()  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **fields)
