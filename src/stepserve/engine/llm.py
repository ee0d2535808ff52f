"""Offline inference in vLLM's shape:

    from stepserve import LLM, SamplingParams
    llm = LLM(model="default", max_num_seqs=64, preemption_mode="swap")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=16))
    outs[0].outputs[0].text
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=None))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import EngineConfig
from stepserve.core.request import Request, SamplingParams
from stepserve.engine.llm_engine import LLMEngine
from stepserve.engine.outputs import RequestOutput

Prompt = str | dict[str, Any] | list[int]
PromptInput = tuple[str | list[int], str | None]  # what to queue, and its cache salt


class LLM:
    """`LLM(model, **settings)`: any scheduler, queue or cache setting by name
    (max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold, num_gpu_blocks,
    block_size, preemption_mode, batching, ...)."""

    def __init__(self, model: str | Path = "default", *, dtype: str = "float32",
                 device: str = "cpu", config: EngineConfig | None = None,
                 quantization: str | None = "auto", **settings: Any) -> None:
        # Without a config, the settings go on the hardware's defaults (host/step_budget.py).
        overrides = ConfigOverrides(settings=settings)
        chosen: EngineConfig | ConfigOverrides = overrides \
            if config is None else config.replace(**settings) if settings else config
        # A max_model_len the model cannot reach is an error when asked for, as in vLLM
        # and `serve`; the default is lowered to the model's.
        self.engine = LLMEngine(model, chosen, dtype=dtype, device=device,
                                quantization=quantization,
                                strict_max_model_len=overrides.sets("max_model_len"))

    @property
    def scheduler(self):
        """The engine core's scheduler, for tests that look inside (nothing drives it)."""
        return self.engine.scheduler

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order. A prompt the
        engine cannot take (too long, empty, a bad field) raises ValueError before anything
        runs. `priority`: one per prompt (lower runs first), as vLLM's; only under the priority
        scheduling policy (otherwise ValueError, as vLLM raises). A prompt dict's
        "cache_salt" is its prefix cache namespace, as vLLM's."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = _params_for(sampling_params, len(prompts))
        if priority is not None:
            if len(priority) != len(params):
                raise ValueError(f"{len(params)} prompts but {len(priority)} priorities")
            params = [dataclasses.replace(p, priority=k)
                      for p, k in zip(params, priority, strict=True)]
        return self._run([_prompt_input(p) for p in prompts], params, use_tqdm)

    def chat(self, messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of {"role", "content"} messages) or
        a list of them, each rendered with the model's chat template, then generated like
        `generate`; outputs in input order."""
        if messages and isinstance(messages[0], dict):
            conversations = [messages]
        else:
            conversations = list(messages)  # type: ignore[arg-type]
        tok = self.engine.tokenizer
        prompts: list[PromptInput] = [
            (tok.encode(tok.apply_chat_template([dict(m) for m in c], add_generation_prompt),
                        add_special_tokens=False), None) for c in conversations]
        return self._run(prompts, _params_for(sampling_params, len(prompts)), use_tqdm)

    def _run(self, prompts: list[PromptInput], params: list[SamplingParams],
             use_tqdm: bool) -> list[RequestOutput]:
        engine = self.engine
        groups: list[list[Request]] = []
        for k, ((prompt, salt), p) in enumerate(zip(prompts, params, strict=True)):
            try:
                group = engine.add_parallel(prompt, p, cache_salt=salt)
                if group[0].is_finished:  # rejected at once: say why
                    raise ValueError(f"prompt {k}: {group[0].finish_message}")
            except ValueError:  # one the engine cannot take: nothing of the batch runs
                for r in (r for g in groups for r in g):
                    engine.abort_request(r.request_id)
                raise
            groups.append(group)
        bar = tqdm(total=sum(len(g) for g in groups), desc="generating", unit="req",
                   disable=not use_tqdm, leave=False, mininterval=0.5)
        finals = engine.run_until_done(lambda result: bar.update(len(result.finished)))
        bar.close()
        return [engine.output_of(g, finals, p if isinstance(p, str) else None)
                for g, (p, _) in zip(groups, prompts, strict=True)]


def _params_for(sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                count: int) -> list[SamplingParams]:
    if sampling_params is None:
        sampling_params = SamplingParams()
    params = ([sampling_params] * count if isinstance(sampling_params, SamplingParams)
              else list(sampling_params))
    if len(params) != count:
        raise ValueError(f"{count} prompts but {len(params)} sampling params")
    return params


def _prompt_input(prompt: Prompt) -> PromptInput:
    """The text or token ids to queue, and the prompt dict's "cache_salt"."""
    if isinstance(prompt, (str, list)):
        return prompt, None
    if isinstance(prompt, dict):
        salt = prompt.get("cache_salt")
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"]), salt
        if "prompt" in prompt:
            return str(prompt["prompt"]), salt
        raise ValueError(f"prompt dict needs 'prompt_token_ids' or 'prompt'; got keys "
                         f"{sorted(prompt)}")
    raise ValueError(f"prompt must be a string, a token id list or a dict; got "
                     f"{type(prompt).__name__}")
