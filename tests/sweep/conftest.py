"""A `stepserve`-like parser with only the sweep and report commands."""

import argparse

import pytest

from stepserve.cli.report import add_report_parser
from stepserve.cli.sweep import add_sweep_parser


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
