"""`stepserve profile`: measure the real engine's step times and fit a cost model that
`simulate`, `sweep`, `bench --sim` and `demo` take as `--cost FILE`."""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from stepserve.cli.parser import add_command, options_from
from stepserve.config.errors import report_error
from stepserve.config.limits import Range
from stepserve.config.user_files import OutputFile, check_output_file, write_outputs

PROFILE_FLAGS = {"repeats": Range(1, 1000), "warmup": Range(0, 100)}


def add_profile_parser(subparsers) -> None:
    p = add_command(subparsers, "profile", profile_command, PROFILE_FLAGS,
                    help="measure the engine's step times and fit a cost model for the "
                         "simulator")
    p.add_argument("--model", default="default", help="preset (default, tiny) or HF directory")
    p.add_argument("--out", default="cost.json", help="the cost file to write")
    p.add_argument("--quick", action="store_true", help="a small grid (a minute, not ten)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds over the grid")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--no-swap", action="store_true", help="skip the KV block copies")


def profile_command(args: argparse.Namespace) -> int:
    from stepserve.profile.job import ProfileOptions, profile, report

    check_output_file("--out", args.out)
    opts = options_from(ProfileOptions, args, swap=not args.no_swap)
    bar = tqdm(desc="profiling", unit="step", file=sys.stderr, leave=False,
               disable=not sys.stderr.isatty(), mininterval=0.5)

    def progress(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update()

    result = profile(opts, progress)
    bar.close()
    print(report(result))
    failed = write_outputs([OutputFile.text("--out", args.out,
                                            lambda: json.dumps(result.cost.to_json(), indent=2))])
    return report_error(failed) if failed else 0
