"""`stepserve models`: which models exist and where their weights live."""

from __future__ import annotations

import argparse
import json

from stepserve.cli.parser import add_command


def add_models_parser(subparsers) -> None:
    m = add_command(subparsers, "models", models_command,
                    help="list models and their local directories")
    m.add_argument("--json", action="store_true")


def models_command(args: argparse.Namespace) -> int:
    from stepserve.model.presets import list_models

    models = list_models()
    if args.json:
        print(json.dumps({"models": models}, indent=2))
        return 0
    for m in models:
        state = "ready" if m["ready"] else "built on first use"
        print(f"{m['name']:>8}: {m['path']} ({state})\n          {m['description']}")
    return 0
