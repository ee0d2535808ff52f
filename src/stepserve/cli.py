"""The `stepserve` command: one subcommand per job, each wired from its own module."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from stepserve.bench.commands import add_bench_parser
from stepserve.cli_errors import UsageError, one_line, report_error
from stepserve.demo import add_demo_parser
from stepserve.engine.commands import add_engine_parsers
from stepserve.metrics.doctor_cmd import add_doctor_parser
from stepserve.plan.commands import add_plan_parser
from stepserve.server.commands import add_serve_parser
from stepserve.sim.commands import add_simulate_parser
from stepserve.sweep.commands import add_sweep_parser
from stepserve.sweep.report_cmd import add_report_parser


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line (argparse prints the
    whole usage first: for `serve`, 30 lines before the one that matters). Subcommand
    parsers are of the same class (add_subparsers uses the parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} "
                     f"--help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stepserve",
        description="A continuous-batching LLM inference engine and scheduling lab.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_demo_parser(sub)
    add_engine_parsers(sub)
    add_serve_parser(sub)
    add_simulate_parser(sub)
    add_bench_parser(sub)
    add_plan_parser(sub)
    add_doctor_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A user's mistake (UsageError, raised anywhere
    below) is one line on stderr and status 2; any other exception is a bug and keeps
    its traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        return report_error(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
