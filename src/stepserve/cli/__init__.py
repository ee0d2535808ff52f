"""The `stepserve` command: one module per subcommand, the only place that knows
argparse. Each turns its parsed flags into typed options (frozen dataclasses defined
next to the library function that takes them) and calls that function.

    demo.py      stepserve demo          -> demo.run_demo(DemoOptions)
    generate.py  stepserve generate      -> engine/generate.run_generate(GenerateOptions)
    models.py    stepserve models        -> model/presets.list_models
    serve.py     stepserve serve         -> run_serve(ServeOptions)
    simulate.py  stepserve simulate      -> sim/job.run_simulate(SimulateOptions)
    bench.py     stepserve bench         -> bench/job.run_bench(BenchOptions)
    profile.py   stepserve profile       -> engine/profile.profile(ProfileOptions)
    plan.py      stepserve plan ...      -> plan/job.run_speedup, run_capacity, run_model_specs
    doctor.py    stepserve doctor        -> metrics/doctor.run_doctor(DoctorOptions)
    sweep.py     stepserve sweep         -> sweep/job.run_sweep(SweepOptions)
    report.py    stepserve report        -> sweep/report_job.run_report(ReportOptions)
    engine_flags.py  the vLLM-style engine flags shared by several commands
    vllm_args.py     vLLM's argv habits: `--max_num_seqs`, a flat `--config` file's flags
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

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
from stepserve.cli_errors import UsageError, one_line, report_error


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line (argparse prints the
    whole usage first: for `serve`, 30 lines before the one that matters). Subcommand
    parsers are of the same class (add_subparsers uses the parent's type)."""

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


def main(argv: list[str] | None = None) -> int:
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
