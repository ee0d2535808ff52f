"""`stepserve doctor RESULT.json | --url http://HOST:PORT [--json]`."""

from __future__ import annotations

from typing import Any

from stepserve.cli.parser import add_command, options_from
from stepserve.metrics.doctor import DoctorOptions, run_doctor
from stepserve.metrics.live_window import INTERVAL_S, WINDOW_S


def add_doctor_parser(subparsers: Any) -> None:
    # the window's bounds are checked by run_doctor, and only with --url
    p = add_command(
        subparsers, "doctor",
        lambda args: run_doctor(options_from(DoctorOptions, args, as_json=args.json)),
        help="apply the alert rules to a result file or a live server",
        description="Read a result file (or a bare summary), or scrape a live server's "
                    "/metrics over a window, and print, per run, each rule that fires: "
                    "severity, rule, the evidence with its numbers, and what to do.")
    p.add_argument("result", metavar="RESULT.json", nargs="?",
                   help='a result file {"runs": [{"name", "batching", "config", "summary"}]} '
                        "or one summary dict")
    p.add_argument("--url", metavar="http://HOST:PORT",
                   help="scrape this server's /metrics instead (stepserve, vLLM, SGLang or "
                        "TGI)")
    p.add_argument("--window-s", type=float, default=WINDOW_S,
                   help="with --url: how long to watch, in seconds (default %(default)g)")
    p.add_argument("--interval-s", type=float, default=INTERVAL_S,
                   help="with --url: seconds between scrapes (default %(default)g; at least "
                        "two scrapes whatever the window)")
    p.add_argument("--json", action="store_true",
                   help='print {"findings": [{"run", "rule", "severity", "evidence", '
                        '"action"}]} instead of text (with --url also "summary", "config" '
                        'and "not_evaluable")')
