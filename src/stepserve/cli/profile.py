"""`stepserve profile`: measure the real engine's step times and fit a cost model that
`simulate`, `sweep`, `bench --sim` and `demo` take as `--cost FILE`; with `--target URL`,
probe any OpenAI-compatible server over HTTP instead (profile/target.py) and write a
target profile, which those take as `--cost FILE` too; `--refit FILE` fits a target
profile's recorded probes again."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from tqdm import tqdm

from stepserve.cli.parser import add_command, options_from
from stepserve.config.errors import UsageError, report_error
from stepserve.config.limits import Range
from stepserve.config.user_files import OutputFile, check_output_file, load_json, write_outputs

PROFILE_FLAGS = {"repeats": Range(1, 1000), "warmup": Range(0, 100)}


def add_profile_parser(subparsers) -> None:
    p = add_command(subparsers, "profile", profile_command, PROFILE_FLAGS,
                    help="measure the engine's step times (or a server's, --target) and "
                         "fit a cost model for the simulator")
    p.add_argument("--model", default=None,
                   help="preset (default, tiny) or HF directory (default: default); with "
                        "--target, the served model's name (default: the first of "
                        "/v1/models)")
    p.add_argument("--out", default=None,
                   help="the file to write (default: cost.json; with --target or --refit: "
                        "target-profile.json)")
    p.add_argument("--quick", action="store_true", help="a small grid (a minute, not ten)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds over the grid")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--no-swap", action="store_true", help="skip the KV block copies")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target", metavar="URL", default=None,
                        help="probe this OpenAI-compatible server (vLLM, SGLang, llama.cpp, "
                             "stepserve) over HTTP and /metrics, e.g. http://127.0.0.1:8000")
    target.add_argument("--refit", metavar="FILE", default=None,
                        help="infer and fit again from a target profile's recorded probes")
    p.add_argument("--api-key", default=None, help="with --target: the server's API key")
    p.add_argument("--budget-s", type=float, default=180.0,
                   help="with --target: seconds the probes may take (they scale to fit)")


def profile_command(args: argparse.Namespace) -> int:
    if args.target is not None or args.refit is not None:
        return target_command(args)
    from stepserve.profile.job import ProfileOptions, profile, report

    out = args.out or "cost.json"
    check_output_file("--out", out)
    opts = options_from(ProfileOptions, args, swap=not args.no_swap,
                        model=args.model or "default")
    bar = tqdm(desc="profiling", unit="step", file=sys.stderr, leave=False,
               disable=not sys.stderr.isatty(), mininterval=0.5)

    def progress(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update()

    result = profile(opts, progress)
    bar.close()
    print(report(result))
    failed = write_outputs([OutputFile.text("--out", out,
                                            lambda: json.dumps(result.cost.to_json(), indent=2))])
    return report_error(failed) if failed else 0


def target_command(args: argparse.Namespace) -> int:
    from stepserve.profile.target import TargetOptions, check_options, run_probes
    from stepserve.profile.target_profile import build_profile, figures_from_profile, report

    out = args.out or "target-profile.json"
    check_output_file("--out", out)
    if args.refit is not None:
        try:
            figs = figures_from_profile(load_json(args.refit, "target profile"))
        except UsageError:
            raise
        except ValueError as e:
            raise UsageError(f"--refit {args.refit!r}: {e}") from None
    else:
        opts = check_options(TargetOptions(args.target, args.api_key, args.model,
                                           args.budget_s))
        bar = tqdm(desc="probing", unit="probe", file=sys.stderr, leave=False,
                   disable=not sys.stderr.isatty(), mininterval=0.5)

        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        try:
            figs = asyncio.run(run_probes(opts, progress))
        finally:
            bar.close()
    try:
        profile = build_profile(figs)
    except ValueError as e:
        raise UsageError(f"cannot fit the probes' figures: {e}") from None
    print(report(profile))
    failed = write_outputs([OutputFile.text("--out", out,
                                            lambda: json.dumps(profile.to_json(), indent=2,
                                                               allow_nan=False))])
    return report_error(failed) if failed else 0
