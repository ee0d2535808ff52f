"""The `stepserve` command: one module per subcommand, the only place that knows
argparse. Each turns its parsed flags into typed options (frozen dataclasses defined
next to the library function that takes them) and calls that function; parser.py is
what they share (one-line mistakes, defaults in help, vLLM's argv habits) and
engine_flags.py the engine settings as flags."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from stepserve.cli import (
    bench,
    demo,
    doctor,
    generate,
    models,
    plan,
    profile,
    report,
    serve,
    simulate,
    sweep,
)
from stepserve.cli.parser import Parser

# in the order `stepserve --help` lists them
COMMANDS = (demo.add_demo_parser, generate.add_generate_parser, models.add_models_parser,
            serve.add_serve_parser, simulate.add_simulate_parser, bench.add_bench_parser,
            profile.add_profile_parser, plan.add_plan_parser, doctor.add_doctor_parser,
            sweep.add_sweep_parser, report.add_report_parser)


def build_parser() -> Parser:
    parser = Parser(
        prog="stepserve",
        description="A continuous-batching LLM inference engine and scheduling lab.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


class PipeGuard:
    """sys.stdout for a reader that may leave early (`stepserve simulate | head -1`): the
    first write or flush that finds the pipe closed points the descriptor at /dev/null
    (as Python's documentation on SIGPIPE advises) and the command goes on quietly, so
    the files it writes after printing (--json, --report) are still written."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            to_devnull(self.stream)
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            to_devnull(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def to_devnull(stream: TextIO) -> None:
    """Point `stream`'s descriptor at /dev/null: what is still buffered, or written
    later, goes nowhere instead of raising BrokenPipeError again (at exit, too)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a command killed by a closed pipe returns


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (a user's mistake: 2, see parser.add_command;
    Ctrl-C, even while the command line is read: 130). stdout is guarded (PipeGuard): a
    reader that closes the pipe ends the output quietly, and the status stands, or is
    141 where the pipe broke outside the guard."""
    stdout = sys.stdout
    sys.stdout = PipeGuard(stdout)  # type: ignore[assignment]
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        to_devnull(stdout)
        return EXIT_CLOSED_PIPE
    finally:
        sys.stdout = stdout
        try:
            stdout.flush()
        except BrokenPipeError:
            to_devnull(stdout)
