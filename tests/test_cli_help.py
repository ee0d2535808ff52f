"""Every command's --help shows each flag's default (or says it must be given)."""

import argparse

import pytest

from stepserve.cli import build_parser


def _commands(parser: argparse.ArgumentParser, name: str = "stepserve"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")


COMMANDS = dict(_commands(build_parser()))


def _flags(parser: argparse.ArgumentParser):
    """(flag, its formatted help) for every optional flag a user may leave out."""
    formatter = parser._get_formatter()
    chosen = {id(a) for g in parser._mutually_exclusive_groups if g.required
              for a in g._group_actions}
    for action in parser._actions:
        if (not action.option_strings or action.help == argparse.SUPPRESS or action.required
                or id(action) in chosen or isinstance(action, argparse._HelpAction)):
            continue
        yield action.option_strings[0], " ".join(formatter._format_action(action).split())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_shows_its_default(command):
    missing = [flag for flag, text in _flags(COMMANDS[command])
               if "default" not in text.lower()]
    assert not missing, f"{command}: no default shown for {', '.join(missing)}"



def test_defaults_are_shown_once_and_as_values(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "requests per point (default: 600, or on the simulator 60 s" in text
    assert "(default: steady)" in text and "(default: 0.05)" in text
    assert "no per-point progress lines (default: off)" in text
    assert "write the sweep result as JSON (default: none)" in text
    assert "(config default: 256)" in text  # an engine flag: the config's value
    assert "(default: None)" not in text
