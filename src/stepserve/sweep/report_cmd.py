"""`stepserve report RESULT.json --out DIR`. matplotlib is imported only when a report
is written, so the other commands do not need it."""

from __future__ import annotations

import argparse

from stepserve.cli_errors import UsageError, reports_usage_errors
from stepserve.user_files import check_output_dir, load_json


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="HTML and PNG report of a sweep, simulate or bench JSON result",
        description="Plot a `stepserve sweep --json`, `simulate --json` or `bench --json` "
                    "result: "
                    "latency CDFs, throughput and P99 against the swept value with the knee, "
                    "queues, batch, tokens per step and preemptions over time.")
    p.add_argument("result", help="the JSON result file")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for index.html and PNGs")
    p.set_defaults(func=run_report_cmd)
    return p


@reports_usage_errors
def run_report_cmd(args: argparse.Namespace) -> int:
    check_output_dir("--out", args.out)  # before reading and plotting
    result = load_json(args.result, "result file")
    if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
        raise UsageError(f"{args.result}: not a sweep, simulate or bench result (no runs list)")
    if not result["runs"]:
        raise UsageError(f"{args.result}: the result has no runs: nothing to plot")
    for i, run in enumerate(result["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("summary"), dict):
            raise UsageError(f"{args.result}: runs[{i}] is not a run (an object with a "
                             "\"summary\" object)")
    from stepserve.sweep.report import write_report

    try:
        page = write_report(result, args.out)
    except (KeyError, TypeError, ValueError) as e:  # a run missing what the plots read
        raise UsageError(f"{args.result}: not a result this report can read "
                         f"({type(e).__name__}: {e})") from None
    except OSError as e:  # the disk filled up, or the folder went away meanwhile
        raise UsageError(f"--out {args.out!r}: cannot write the report ({e})") from None
    print(f"wrote {page}")
    return 0
