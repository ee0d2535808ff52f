"""The engine settings as vLLM-style flags (`--max-num-seqs 40`,
`--no-enable-chunked-prefill`), one per config field, with its help text and choices;
vLLM's names for settings we name otherwise are aliases (`--num-gpu-blocks-override`,
`--scheduling-policy`, `--kv-cache-memory-bytes`, which reads sizes as vLLM does: `4GiB`,
`4G`). Also here: `--dtype` with vLLM's values, and `--quantization`; the rest of vLLM's
serve flags come from vllm_serve_flags.py."""

from __future__ import annotations

import argparse
from typing import Any

from stepserve.cli.parser import COMMAND_KEYS_DEST, CONFIG_PROBLEM_DEST
from stepserve.cli.vllm_serve_flags import add_vllm_serve_flags
from stepserve.config.load import (
    TEXT_VALUES,
    VLLM_ALIASES,
    ConfigOverrides,
    config_fields,
    parse_bool,
)
from stepserve.engine.dtypes import DTYPE_CHOICES
from stepserve.model.modes import QUANTIZATION_CHOICES  # torch-free


def _text_type(reader):
    """argparse's type for a setting read from text (true/false: parse_bool, a size:
    parse_size): its message is shown as is."""
    def read(text: str):
        try:
            return reader(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return read


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per config field (and vLLM's name for it, where it differs);
    defaults are None so only given flags apply."""
    group = parser.add_argument_group("engine settings (vLLM-style flags; override --config)")
    for _section, f in config_fields():
        names = [f.name, *(vllm for vllm, ours in VLLM_ALIASES.items() if ours == f.name)]
        flags = ["--" + name.replace("_", "-") for name in names]
        allowed = f.metadata["allowed"]
        if allowed.kind is bool:
            group.add_argument(*flags, dest=f.name, type=_text_type(parse_bool), nargs="?",
                               const=True, default=None, help=_help(f))
            group.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                               action="store_false", help=argparse.SUPPRESS)
        else:
            reader = TEXT_VALUES.get(f.name)
            group.add_argument(*flags, dest=f.name, default=None,
                               choices=allowed.choices or None,
                               type=_text_type(reader) if reader else allowed.kind, help=_help(f))
    add_vllm_serve_flags(parser)  # the rest of vLLM's serve flags: no effect, some values


def _help(f: Any) -> str:
    """A setting's help with the config's default (the flag itself is unset unless
    given, so that a config file, a scenario's run or the hardware's defaults apply)."""
    value = f.default
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) \
        else str(value)
    return f"{f.metadata['help']} (config default: {shown})".replace("%", "%%")


def config_overrides(args: argparse.Namespace) -> ConfigOverrides:
    """--config FILE (where the command has it) and the engine flags given. A problem
    with a vLLM-style file found while parsing (parser.py) is raised here, as the
    command's UsageError."""
    problem = getattr(args, CONFIG_PROBLEM_DEST, None)
    if problem is not None:
        raise problem
    given = {f.name: getattr(args, f.name) for _s, f in config_fields()
             if getattr(args, f.name, None) is not None}
    return ConfigOverrides(getattr(args, "config", None), given,
                           getattr(args, COMMAND_KEYS_DEST, frozenset()))


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="weights and KV cache dtype, as vLLM takes it: auto (float32 on "
                             "CPU, the checkpoint's float16/bfloat16 on CUDA, a float32 "
                             "checkpoint as float16), half = float16, float = float32. A "
                             "dtype named (not auto) means float weights in it, unless "
                             "--quantization q4_1 is given too")


def add_quantization_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantization", "-q", default="auto", choices=QUANTIZATION_CHOICES,
                        help="weight mode: auto (q4_1 where the model has a GGUF, the CPU "
                             "runs stepserve's kernels and --dtype is auto; else none), none "
                             "(float weights at --dtype), q4_1 (the GGUF's own Q4_1 groups "
                             "through stepserve's kernels, float32); see docs/guide.md")
