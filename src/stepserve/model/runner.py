"""`TorchRunner`: executes a `SchedulerOutput` on a real model with a paged KV cache (block
copies, one forward pass over the decode-first ragged batch, a sample per finished chunk).
It never mutates requests; block ids come from the engine core's KV block manager.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stepserve.config.settings import CacheConfig
from stepserve.core.output import RunnerOutput, SchedulerOutput
from stepserve.core.request import Request, TokenLogprobs
from stepserve.model.fused_decode import FusedDecoder
from stepserve.model.ggml_kernels import load_kernels
from stepserve.model.kv_store import KVStore, kv_blocks, num_blocks_for_memory
from stepserve.model.llama import LlamaModel
from stepserve.model.model_args import ModelArgs
from stepserve.model.modes import MODE_DESCRIPTIONS, choose_quantization, weight_nbytes
from stepserve.model.paged_attention import (
    GatherBuffers,
    build_attention_metadata,
    decode_first_order,
)
from stepserve.model.presets import resolve_gguf, resolve_model
from stepserve.model.sampler import sample, token_logprobs
from stepserve.model.tokenizer import Tokenizer
from stepserve.model.weights import DTYPES, load_model, load_packed_model

log = logging.getLogger("stepserve.model")


def new_tokens(request: Request, start: int, n: int) -> list[int]:
    """`request.all_token_ids[start:start + n]` without copying a 4k-token history."""
    p = request.num_prompt_tokens
    head = request.prompt_token_ids[start:start + n] if start < p else []
    return head + request.output_token_ids[max(start - p, 0):max(start + n - p, 0)]


@dataclass(slots=True)
class StepBatch:
    """One step's flattened ragged batch, in decode-first order."""

    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)  # flat row of each sampling seq
    sample_of: list[int] = field(default_factory=list)  # and its index in the step
    # (index in the step, flat row, the prompt token that row predicts)
    prompt_rows: list[tuple[int, int, int]] = field(default_factory=list)
    num_decoding: int = 0


def build_step_batch(sched_out: SchedulerOutput, scheduled: list[int]) -> StepBatch:
    requests, counts = sched_out.requests, sched_out.num_scheduled_tokens
    ends = [requests[i].num_computed_tokens + counts[i] for i in scheduled]
    decoding = [requests[i].is_decoding for i in scheduled]
    b = StepBatch(num_decoding=sum(decoding))
    for i in (scheduled[j] for j in decode_first_order(decoding, ends)):
        req, n = requests[i], counts[i]
        start = req.num_computed_tokens
        if start + n > req.num_tokens:
            raise ValueError(f"request {req.request_id}: {n} tokens scheduled at "
                             f"{start} but it has only {req.num_tokens}")
        base = len(b.input_ids)
        b.starts.append(start)
        b.lens.append(n)
        b.tables.append(sched_out.block_tables[i])
        b.input_ids += new_tokens(req, start, n)
        if req.prompt_logprobs is not None:
            # position p predicts prompt token p + 1; positions already scored (before a
            # recompute, say) are not scored again
            prompt = req.prompt_token_ids
            first = max(start, len(req.prompt_logprobs))
            b.prompt_rows += [(i, base + p - start, prompt[p + 1])
                              for p in range(first, min(start + n, len(prompt) - 1))]
        if start + n == req.num_tokens:
            b.sample_rows.append(len(b.input_ids) - 1)
            b.sample_of.append(i)
    return b


class TorchRunner:
    def __init__(self, model: str | Path = "default", *, block_size: int = 16,
                 num_gpu_blocks: int | None = None, num_cpu_blocks: int = 0,
                 kv_cache_memory: int | None = None,
                 gpu_memory_utilization: float | None = None, swap_space_gib: float = 0.0,
                 dtype: str = "float32", device: str = "cpu",
                 quantization: str | None = "auto",
                 tokenizer: str | Path | None = None) -> None:
        """`tokenizer`: a folder holding the tokenizer (vLLM's --tokenizer; default: the
        model's)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype = {dtype!r}: must be one of {', '.join(DTYPES)}")
        self.device = torch.device(device)
        self.model_path = resolve_model(model)
        self.model = self._load_model(model, dtype, quantization)
        self.args: ModelArgs = self.model.args
        self.tokenizer = Tokenizer(self.model_path if tokenizer is None else tokenizer)
        if self.tokenizer.vocab_size > self.args.vocab_size:
            raise ValueError(f"tokenizer {tokenizer}: its {self.tokenizer.vocab_size} tokens "
                             f"are more than the model's vocabulary of "
                             f"{self.args.vocab_size}; give the model's own tokenizer")
        self.kv_budget, num_gpu_blocks = kv_blocks(self.args, block_size, self.device,
                                                   num_gpu_blocks, kv_cache_memory,
                                                   gpu_memory_utilization)
        if swap_space_gib:  # vLLM's --swap-space: GiB of CPU blocks
            num_cpu_blocks = num_blocks_for_memory(int(swap_space_gib * (1 << 30)), self.args,
                                                   block_size)
        self.kv = KVStore(self.args, num_gpu_blocks, block_size, num_cpu_blocks, self.device,
                          DTYPES[dtype])
        # what the engine reads
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        self.block_size = block_size
        self.gather_buffers = GatherBuffers()
        # Before each step: how many threads it runs on (host/step_threads.py); None:
        # torch's count as it stands.
        self.thread_count: Callable[[], int] | None = None
        self.max_threads = torch.get_num_threads()  # the count at load: the most a step uses

    def _load_model(self, model: str | Path, dtype: str,
                    quantization: str | None) -> LlamaModel:
        """The weights in the mode asked for (modes.py); sets `quantization` to what was
        chosen."""
        gguf = resolve_gguf(model, self.model_path)
        self.quantization, self.quantization_note = choose_quantization(
            quantization, dtype, self.device, gguf)
        if self.quantization_note is not None:
            log.warning("quantization auto: float weights, not the GGUF's own (%s)",
                        self.quantization_note)
        if self.quantization == "none":
            return load_model(self.model_path, dtype, self.device)
        assert gguf is not None  # choose_quantization checked
        loaded = load_packed_model(gguf, self.model_path)  # q4_1: float32 on the CPU
        loaded.fused_decode = FusedDecoder.for_model(loaded, load_kernels())
        return loaded

    @classmethod
    def from_config(cls, model: str | Path, cache: CacheConfig, dtype: str = "float32",
                    device: str = "cpu", quantization: str | None = "auto",
                    tokenizer: str | Path | None = None) -> TorchRunner:
        return cls(model, block_size=cache.block_size, num_gpu_blocks=cache.num_gpu_blocks,
                   num_cpu_blocks=cache.num_cpu_blocks, kv_cache_memory=cache.kv_cache_memory,
                   gpu_memory_utilization=cache.gpu_memory_utilization,
                   swap_space_gib=cache.swap_space,
                   dtype=dtype, device=device, quantization=quantization,
                   tokenizer=tokenizer)

    @property
    def eos_token_id(self) -> int | None:
        tok = self.tokenizer.eos_token_id
        return tok if tok is not None else self.args.eos_token_id

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight the model holds (what a decode step streams, once each)."""
        return weight_nbytes(self.model)

    def describe(self) -> str:
        a = self.args
        weights = MODE_DESCRIPTIONS[self.quantization]
        if self.quantization_note is not None:
            weights += f" ({self.quantization_note})"
        return (f"{self.model_path} ({a.architecture}, {a.num_parameters / 1e6:.1f}M params, "
                f"{a.dtype}, {self.device}, weights {weights}"
                f" {self.weight_bytes / 1e6:.0f} MB); "
                f"{self.kv_budget.describe(a, self.block_size)}")

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        t0 = time.perf_counter()
        before = torch.get_num_threads()
        threads = before if self.thread_count is None else self.thread_count()
        if threads == before:
            return self._execute(sched_out, t0)
        torch.set_num_threads(threads)  # torch's ops and our kernels follow it
        try:  # this step only: the process's count (what others read) stays as it was
            return self._execute(sched_out, t0)
        finally:
            torch.set_num_threads(before)

    def _execute(self, sched_out: SchedulerOutput, t0: float) -> RunnerOutput:
        # Swap out first: the device blocks it frees may be the targets of this swap in.
        self.kv.copy_blocks_to_cpu(sched_out.swap_out)
        self.kv.copy_blocks_from_cpu(sched_out.swap_in)
        out = RunnerOutput([None] * len(sched_out.requests), 0.0)
        scheduled = [i for i, n in enumerate(sched_out.num_scheduled_tokens) if n > 0]
        if scheduled:
            self._forward_and_sample(sched_out, scheduled, out)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out.elapsed_s = time.perf_counter() - t0
        return out

    def _forward_and_sample(self, sched_out: SchedulerOutput, scheduled: list[int],
                            out: RunnerOutput) -> None:
        requests = sched_out.requests
        b = build_step_batch(sched_out, scheduled)
        meta, positions = build_attention_metadata(b.starts, b.lens, b.tables,
                                                   self.block_size, self.device,
                                                   self.args.sliding_window,
                                                   self.gather_buffers, b.num_decoding)
        ids = torch.tensor(b.input_ids, dtype=torch.long, device=self.device)
        rows = torch.tensor(b.sample_rows + [row for _, row, _ in b.prompt_rows],
                            dtype=torch.long, device=self.device)
        if not b.prompt_rows:
            logits = self.model(ids, positions, meta, self.kv, rows)
        else:
            logits = self._with_prompt_logprobs(ids, positions, meta, rows, b, out,
                                                requests)
        if b.sample_of:
            sampled = sample(logits, [requests[i] for i in b.sample_of])
            for k, i in enumerate(b.sample_of):
                out.sampled_token_ids[i] = sampled.token_ids[k]
                if sampled.logprobs[k] is not None:
                    if out.logprobs is None:
                        out.logprobs = [None] * len(requests)
                    out.logprobs[i] = sampled.logprobs[k]

    @torch.inference_mode()
    def _with_prompt_logprobs(self, ids, positions, meta, rows, b: StepBatch,
                              out: RunnerOutput, requests: list[Request]) -> torch.Tensor:
        """The sampling rows' logits; on the way, the logprobs of the prompt tokens this
        chunk predicts, for the requests that ask (their logits in slices of
        PROMPT_LOGITS_ROWS rows: a whole chunk's [tokens, vocab] could be gigabytes)."""
        model = self.model
        hidden = model.norm(model.hidden_states(ids, positions, meta, self.kv)
                            .index_select(0, rows))
        num_sample = len(b.sample_rows)
        found = []
        for a in range(0, len(b.prompt_rows), PROMPT_LOGITS_ROWS):
            part = b.prompt_rows[a:a + PROMPT_LOGITS_ROWS]
            logits = model.logits(hidden[num_sample + a:num_sample + a + len(part)])
            found += token_logprobs(logits, [target for _, _, target in part],
                                    [requests[i].sampling_params.prompt_logprobs or 0
                                     for i, _, _ in part])
        per: dict[int, list[TokenLogprobs]] = {}
        for (i, _, _), lp in zip(b.prompt_rows, found, strict=True):
            per.setdefault(i, []).append(lp)
        out.prompt_logprobs = [per.get(i) for i in range(len(requests))]
        return model.logits(hidden[:num_sample])


PROMPT_LOGITS_ROWS = 256
