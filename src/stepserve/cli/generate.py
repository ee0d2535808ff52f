"""`stepserve generate`: one prompt through the real engine, with its timing."""

from __future__ import annotations

import argparse

from stepserve.cli.engine_flags import (
    add_config_arguments,
    add_dtype_argument,
    add_quantization_argument,
    config_overrides,
)
from stepserve.cli.parser import add_command, options_from
from stepserve.engine.generate import GenerateOptions, run_generate


def add_generate_parser(subparsers) -> None:
    g = add_command(subparsers, "generate", generate_command,
                    help="complete one prompt on a real model")
    g.add_argument("--model", default="default", help="preset (default, tiny) or HF directory")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    add_dtype_argument(g)
    g.add_argument("--device", default="cpu")
    g.add_argument("--config", help="engine config YAML")
    add_quantization_argument(g)
    add_config_arguments(g)


def generate_command(args: argparse.Namespace) -> int:
    return run_generate(options_from(GenerateOptions, args, stop=tuple(args.stop),
                                     config=config_overrides(args)))
