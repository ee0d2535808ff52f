"""`stepserve generate` (one prompt through the real engine, with its timing) and
`stepserve models` (which models exist and where their weights live)."""

from __future__ import annotations

import argparse
import json
import sys

from stepserve.cli_errors import UsageError, report_error, reports_usage_errors
from stepserve.config import ConfigError
from stepserve.config_load import add_config_arguments, config_from_args


def add_engine_parsers(subparsers) -> None:
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
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--device", default="cpu")
    g.add_argument("--config", help="engine config YAML")
    add_config_arguments(g)
    g.set_defaults(func=run_generate)

    m = subparsers.add_parser("models", help="list models and their local directories")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=run_models)


def check_device(name: str) -> None:
    """A torch device this machine has: a typo or a missing GPU is one line, not a torch
    traceback from deep inside the model load."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r}: not a torch device, e.g. cpu, cuda, cuda:0") \
            from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"--device {name!r}: no CUDA device here; use --device cpu")
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device {name!r}: this machine has {count} CUDA device(s), "
                             f"cuda:0..cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name!r}: MPS is not available here; use --device cpu")


@reports_usage_errors
def run_generate(args: argparse.Namespace) -> int:
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.request import SamplingParams

    check_device(args.device)
    try:
        config = config_from_args(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                stop=tuple(args.stop), ignore_eos=args.ignore_eos)
        engine = LLMEngine(args.model, config, dtype=args.dtype, device=args.device)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        return report_error(e)
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    req = engine.add_request(prompt, params)
    if req.is_finished:  # refused at admission, e.g. longer than max_model_len
        return report_error(req.finish_message or "the request was refused")
    engine.run_until_done()
    out = engine.output_of(req)
    m = out.metrics
    n = len(req.output_token_ids)
    print(out.outputs[0].text)
    ttft = m.first_token_time - m.arrival_time if m.first_token_time else float("nan")
    e2e = (m.finish_time or m.arrival_time) - m.arrival_time
    tpot = (e2e - ttft) / (n - 1) if n > 1 else float("nan")
    print(f"\n[{n} tokens, finish_reason={out.outputs[0].finish_reason}; prompt "
          f"{req.num_prompt_tokens} tokens; TTFT {ttft * 1000:.0f} ms, TPOT {tpot * 1000:.1f} ms, "
          f"total {e2e:.2f} s; {engine.runner.describe()}]", file=sys.stderr)
    return 0


def run_models(args: argparse.Namespace) -> int:
    from stepserve.model.presets import list_models

    models = list_models()
    if args.json:
        print(json.dumps({"models": models}, indent=2))
        return 0
    for m in models:
        state = "ready" if m["ready"] else "built on first use"
        print(f"{m['name']:>8}: {m['path']} ({state})\n          {m['description']}")
    return 0
