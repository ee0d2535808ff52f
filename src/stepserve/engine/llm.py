"""Offline inference in vLLM's shape:

    from stepserve import LLM, SamplingParams
    llm = LLM(model="default", max_num_seqs=64, preemption_mode="swap")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=16))
    outs[0].outputs[0].text
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stepserve.config import EngineConfig
from stepserve.config_load import ConfigOverrides
from stepserve.engine.drive import run_to_completion
from stepserve.engine.llm_engine import LLMEngine
from stepserve.engine.outputs import RequestOutput
from stepserve.request import SamplingParams

Prompt = str | dict[str, Any] | list[int]


class LLM:
    """`LLM(model, **settings)`: any scheduler, queue or cache setting by name
    (max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold, num_gpu_blocks,
    block_size, preemption_mode, batching, ...)."""

    def __init__(self, model: str | Path = "default", *, dtype: str = "float32",
                 device: str = "cpu", config: EngineConfig | None = None,
                 num_kv_blocks: int | None = None, quantization: str | None = "auto",
                 **settings: Any) -> None:
        if num_kv_blocks is not None:
            settings["num_gpu_blocks"] = num_kv_blocks
        # Without a config, the settings go on the hardware's defaults (step_budget.py).
        chosen: EngineConfig | ConfigOverrides = ConfigOverrides(settings=settings) \
            if config is None else config.replace(**settings) if settings else config
        self.engine = LLMEngine(model, chosen, dtype=dtype, device=device,
                                quantization=quantization)

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order. A prompt the
        engine cannot take (too long, empty) raises ValueError before anything runs."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        engine = self.engine
        requests = []
        for prompt, p in zip(prompts, params):
            req = engine.add_request(_prompt_input(prompt), p)
            requests.append(req)
            if req.is_finished:  # rejected at once: undo the batch, say why
                for r in requests[:-1]:
                    engine.abort_request(r.request_id)
                engine.release(requests)
                raise ValueError(f"prompt {len(requests) - 1}: {req.finish_message}")
        bar = tqdm(total=len(requests), desc="generating", unit="req", disable=not use_tqdm,
                   leave=False, mininterval=0.5)
        run_to_completion(engine, lambda result: bar.update(len(result.finished)))
        bar.close()
        outputs = [engine.output_of(r) for r in requests]
        engine.release(requests)
        return outputs


def _prompt_input(prompt: Prompt) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return str(prompt["prompt"])
        raise ValueError(f"prompt dict needs 'prompt_token_ids' or 'prompt'; got keys "
                         f"{sorted(prompt)}")
    if isinstance(prompt, list):
        return prompt
    raise ValueError(f"prompt must be a string, a token id list or a dict; got "
                     f"{type(prompt).__name__}")
