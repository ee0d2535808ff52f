"""`stepserve report RESULT.json --out DIR`."""

from __future__ import annotations

import argparse

from stepserve.config.errors import reports_usage_errors
from stepserve.sweep.report import ReportOptions, run_report


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="HTML and PNG report of a sweep, simulate or bench JSON result",
        description="Plot a `stepserve sweep --json`, `simulate --json` or `bench --json` "
                    "result: "
                    "latency CDFs, throughput and P99 against the swept value with the knee, "
                    "queues, batch, tokens per step and preemptions over time.")
    p.add_argument("result", help="the JSON result file")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for index.html and PNGs")
    p.set_defaults(func=report_command)
    return p


@reports_usage_errors
def report_command(args: argparse.Namespace) -> int:
    return run_report(ReportOptions(args.result, args.out))
