"""`stepserve report RESULT.json --out DIR`."""

from __future__ import annotations

from stepserve.cli.parser import add_command
from stepserve.sweep.report import ReportOptions, run_report


def add_report_parser(subparsers) -> None:
    p = add_command(
        subparsers, "report", lambda args: run_report(ReportOptions(args.result, args.out)),
        help="HTML and PNG report of a sweep, simulate or bench JSON result",
        description="Plot a `stepserve sweep --json`, `simulate --json` or `bench --json` "
                    "result: latency CDFs, throughput and P99 against the swept value with "
                    "the knee, queues, batch, tokens per step and preemptions over time.")
    p.add_argument("result", help="the JSON result file")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for index.html and PNGs")
