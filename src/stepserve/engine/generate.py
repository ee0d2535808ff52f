"""`stepserve generate`'s job: one prompt through the real engine, with its timing."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from stepserve.config.errors import UsageError, report_error
from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import ConfigError
from stepserve.core.request_limits import check_text
from stepserve.engine.dtypes import resolve_dtype
from stepserve.model.modes import quantization_for


@dataclass(frozen=True)
class GenerateOptions:
    prompt: str
    model: str = "default"  # a preset (default, tiny) or a HF directory
    chat: bool = False  # wrap the prompt in the chat template
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    dtype: str = "auto"  # vLLM's values (engine/dtypes.py)
    quantization: str = "auto"  # weight mode (model/modes.py)
    device: str = "cpu"
    config: ConfigOverrides = ConfigOverrides()


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


def run_generate(options: GenerateOptions) -> int:
    """Print the completion, then its timing on stderr; the exit status."""
    from stepserve.core.request import SamplingParams
    from stepserve.engine.llm_engine import LLMEngine

    o = options
    # valid Unicode (argv reads a byte that is not UTF-8 as a lone surrogate), checked
    # before the model loads
    for flag, text in (("--prompt", o.prompt), *(("--stop", s) for s in o.stop)):
        if problem := check_text(flag, text):
            raise UsageError(problem)
    check_device(o.device)
    try:
        o.config.apply()  # a bad setting fails before the model loads
        params = SamplingParams(max_tokens=o.max_tokens, temperature=o.temperature,
                                top_p=o.top_p, top_k=o.top_k, seed=o.seed,
                                stop=tuple(o.stop), ignore_eos=o.ignore_eos)
        engine = LLMEngine(o.model, o.config, device=o.device,
                           dtype=resolve_dtype(o.dtype, o.model, o.device),
                           strict_max_model_len=o.config.sets("max_model_len"),
                           quantization=quantization_for(o.quantization, o.dtype))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        return report_error(e)
    prompt = o.prompt
    if o.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    req = engine.add_request(prompt, params)
    if req.is_finished:  # refused at admission, e.g. longer than max_model_len
        return report_error(req.finish_message or "the request was refused")
    out = engine.output_of(req, engine.run_until_done())
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
