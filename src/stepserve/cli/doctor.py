"""`stepserve doctor RESULT.json | --url http://HOST:PORT [--json]`, with the server's
engine settings, where it does not publish them (vLLM), from `--config FILE` (vLLM's flat
serve config, or ours) or vLLM-style flags (`--max-num-seqs 4`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.parser import CONFIG_PROBLEM_DEST, add_command, options_from
from stepserve.config.load import OWNER, ConfigOverrides, setting_name
from stepserve.config.settings import SECTIONS
from stepserve.config.user_files import load_yaml
from stepserve.metrics.doctor import DoctorOptions, run_doctor
from stepserve.metrics.live_window import INTERVAL_S, WINDOW_S


def add_doctor_parser(subparsers: Any) -> None:
    # the window's bounds are checked by run_doctor, and only with --url
    p = add_command(
        subparsers, "doctor",
        lambda args: run_doctor(options_from(DoctorOptions, args, as_json=args.json,
                                             settings=server_settings(args))),
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
                        '"action"}]} instead of text (with --url also "summary", "config", '
                        '"not_evaluable", and "settings_from" and "bounds" where there are '
                        "any)")
    p.add_argument("--config", metavar="FILE",
                   help="the server's engine config, for the settings the rules judge by "
                        "and the advice names (vLLM publishes none): vLLM's flat serve "
                        "config YAML (max-num-seqs: 4) or ours; its other keys (model, "
                        "port) are the server's, not the doctor's, and are skipped")
    add_config_arguments(p)


def server_settings(args: argparse.Namespace) -> ConfigOverrides:
    """--config FILE and the engine flags given. The parser reads a vLLM-style file's
    keys that are no engine setting as the command's flags and refuses the others; a
    serve config's are the server's (model, port), so here they are skipped instead.
    The file is read again for them, which reports a file that cannot be read."""
    setattr(args, CONFIG_PROBLEM_DEST, None)
    overrides = config_overrides(args)
    if overrides.config_file is None:
        return overrides
    data = load_yaml(overrides.config_file, "config file")
    server_keys = {setting_name(str(key)) for key in data
                   if setting_name(str(key)) not in SECTIONS
                   and setting_name(str(key)) not in OWNER} if isinstance(data, dict) else set()
    return dataclasses.replace(overrides,
                               command_keys=overrides.command_keys | frozenset(server_keys))
