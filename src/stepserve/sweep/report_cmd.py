"""`stepserve report RESULT.json --out DIR`. matplotlib is imported only when a report
is written, so the other commands do not need it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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


def run_report_cmd(args: argparse.Namespace) -> int:
    try:
        result = json.loads(Path(args.result).read_text())
        if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
            raise ValueError(f"{args.result}: not a sweep, simulate or bench result (no runs list)")
        from stepserve.sweep.report import write_report

        page = write_report(result, args.out)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0
