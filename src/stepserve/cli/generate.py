"""`stepserve generate`: one prompt through the real engine, with its timing."""

from __future__ import annotations

import argparse

from stepserve.cli.engine_flags import (
    add_config_arguments,
    add_dtype_argument,
    add_quantization_argument,
    config_overrides,
)
from stepserve.config.errors import reports_usage_errors
from stepserve.engine.generate import GenerateOptions, run_generate


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    g = subparsers.add_parser("generate", help="complete one prompt on a real model")
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
    g.set_defaults(func=generate_command)
    return g


@reports_usage_errors
def generate_command(args: argparse.Namespace) -> int:
    return run_generate(GenerateOptions(
        prompt=args.prompt, model=args.model, chat=args.chat, max_tokens=args.max_tokens,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        stop=tuple(args.stop), ignore_eos=args.ignore_eos, dtype=args.dtype,
        quantization=args.quantization, device=args.device, config=config_overrides(args)))
