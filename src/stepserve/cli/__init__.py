"""The `stepserve` command: one module per subcommand, the only place that knows
argparse. Each turns its parsed flags into typed options (frozen dataclasses defined
next to the library function that takes them) and calls that function.

    demo.py      stepserve demo          -> demo.run_demo(DemoOptions)
    generate.py  stepserve generate      -> engine/generate.run_generate(GenerateOptions)
    models.py    stepserve models        -> model/presets.list_models
    serve.py     stepserve serve         -> run_serve(ServeOptions)
    simulate.py  stepserve simulate      -> sim/job.run_simulate(SimulateOptions)
    bench.py     stepserve bench         -> bench/job.run_bench(BenchOptions)
    profile.py   stepserve profile       -> profile/job.profile(ProfileOptions)
    plan.py      stepserve plan ...      -> plan/job.run_speedup, run_capacity, run_model_specs
    doctor.py    stepserve doctor        -> metrics/doctor.run_doctor(DoctorOptions)
    sweep.py     stepserve sweep         -> sweep/job.run_sweep(SweepOptions)
    report.py    stepserve report        -> sweep/report.run_report(ReportOptions)
    engine_flags.py  the vLLM-style engine flags shared by several commands
    vllm_args.py     vLLM's argv habits: `--max_num_seqs`, a flat `--config` file's flags
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any, NoReturn, TextIO

from stepserve.cli.bench import add_bench_parser
from stepserve.cli.demo import add_demo_parser
from stepserve.cli.doctor import add_doctor_parser
from stepserve.cli.generate import add_generate_parser
from stepserve.cli.models import add_models_parser
from stepserve.cli.plan import add_plan_parser
from stepserve.cli.profile import add_profile_parser
from stepserve.cli.report import add_report_parser
from stepserve.cli.serve import add_serve_parser
from stepserve.cli.simulate import add_simulate_parser
from stepserve.cli.sweep import add_sweep_parser
from stepserve.cli.vllm_args import (
    COMMAND_KEYS_DEST,
    CONFIG_PROBLEM_DEST,
    config_file_flags,
    dashed_flags,
)
from stepserve.config.errors import UsageError, one_line, report_error


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
    """argparse, but a mistake on the command line is one line (argparse prints the
    whole usage first: for `serve`, 30 lines before the one that matters), and every
    flag's help shows its default. Subcommand parsers are of the same class
    (add_subparsers uses the parent's type) and so take the same formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        formatter = super()._get_formatter()
        if isinstance(formatter, DefaultsHelpFormatter):
            formatter.chosen = frozenset(id(a) for g in self._mutually_exclusive_groups
                                         if g.required for a in g._group_actions)
        return formatter

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} "
                     f"--help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        """vLLM's habits first (cli/vllm_args.py): `--max_num_seqs`, and a flat
        `--config` file's keys as flags that the command line overrides."""
        argv = dashed_flags(sys.argv[1:] if args is None else list(args))
        keys: frozenset[str] = frozenset()
        problem = None
        if "--config" in self._option_string_actions:
            try:
                flags, keys = config_file_flags(self, argv)
                argv = flags + argv
            except UsageError as e:  # reported by the command (`error: ...`, exit 2)
                problem = e
        ns, extras = super().parse_known_args(argv, namespace)
        if keys:
            setattr(ns, COMMAND_KEYS_DEST, keys)
        if problem is not None:
            setattr(ns, CONFIG_PROBLEM_DEST, problem)
        return ns, extras


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stepserve",
        description="A continuous-batching LLM inference engine and scheduling lab.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_demo_parser(sub)
    add_generate_parser(sub)
    add_models_parser(sub)
    add_serve_parser(sub)
    add_simulate_parser(sub)
    add_bench_parser(sub)
    add_profile_parser(sub)
    add_plan_parser(sub)
    add_doctor_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)
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
    """`_command` with stdout guarded (PipeGuard): a reader that closes the pipe ends the
    output quietly; the command's status stands, or 141 where the pipe broke outside
    the guard."""
    stdout = sys.stdout
    sys.stdout = PipeGuard(stdout)  # type: ignore[assignment]
    try:
        return _command(argv)
    except BrokenPipeError:
        to_devnull(stdout)
        return EXIT_CLOSED_PIPE
    finally:
        sys.stdout = stdout
        try:
            stdout.flush()
        except BrokenPipeError:
            to_devnull(stdout)


def _command(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A user's mistake (UsageError, raised anywhere
    below) is one line on stderr and status 2; any other exception is a bug and keeps
    its traceback. Ctrl-C, even while the command line is read, is status 130."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as e:
        return report_error(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
