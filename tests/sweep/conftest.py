"""A `stepserve`-like parser with only the sweep and report commands (cli.py wiring is
the lead's)."""

import argparse

import pytest

from stepserve.sweep.commands import add_sweep_parser
from stepserve.sweep.report_cmd import add_report_parser


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stepserve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_sweep_parser(sub)
    add_report_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def cli():
    return _main
