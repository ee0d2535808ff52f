"""Scheduling defaults from the hardware: how many tokens one step may carry, so that a
wave of prompts never stalls the running sequences for seconds.

The config's defaults (8,192 batched tokens, no chunk cap) suit a GPU; a CPU prefills a
few hundred tokens per second, so there the engine starts from

    prefill rate   r = threads x core_flops / (2 x P)   tokens/s  (P: the parameters a
                   prompt token passes; CORE_GFLOPS: ~40% of a 2.5 GHz core's FMA peak)
    chunk          long_prefill_token_threshold = r x PREFILL_STEP_S, down to a multiple
                   of 64, within [64, 2048]: a long prompt adds at most ~0.5 s to a step
    budget         max_num_batched_tokens = chunk + DECODE_ROOM (the running decodes)

E.g. SmolLM2-135M on 2 AVX2 threads: r = 300 tokens/s, chunk 128, budget 256. The user's
settings win, and the defaults bend to them (hardware_base).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.config.settings import EngineConfig

PREFILL_STEP_S = 0.5  # prompt work one step may add on a CPU
DECODE_ROOM = 128  # budget kept for decodes beside one chunk
CHUNK_MULTIPLE, MIN_CHUNK, MAX_CHUNK = 64, 64, 2048
CORE_GFLOPS = {"AVX512": 64.0, "AVX2": 32.0}  # float32 GEMM, sustained, per core
OTHER_CORE_GFLOPS = 8.0


@dataclass(frozen=True)
class Hardware:
    """What the step budget depends on: the device kind and, on a CPU, its cores."""

    device_type: str  # "cpu", "cuda", ...
    threads: int = 1
    cpu_capability: str = "DEFAULT"  # torch.backends.cpu.get_cpu_capability()


@dataclass(frozen=True)
class StepBudget:
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    prefill_tokens_per_s: float  # the estimate they came from

    def describe(self) -> str:
        return (f"step budget {self.max_num_batched_tokens} tokens, chunk "
                f"{self.long_prefill_token_threshold} (CPU prefill ~"
                f"{self.prefill_tokens_per_s:.0f} tok/s estimated)")


def cpu_step_budget(hw: Hardware, prefill_params: int) -> StepBudget | None:
    """The CPU rule above; None on other devices (the config's defaults stand)."""
    if hw.device_type != "cpu":
        return None
    core_gflops = CORE_GFLOPS.get(hw.cpu_capability, OTHER_CORE_GFLOPS)
    rate = hw.threads * core_gflops * 1e9 / (2 * max(prefill_params, 1))
    chunk = int(rate * PREFILL_STEP_S) // CHUNK_MULTIPLE * CHUNK_MULTIPLE
    chunk = min(max(chunk, MIN_CHUNK), MAX_CHUNK)
    return StepBudget(chunk + DECODE_ROOM, chunk, rate)


def hardware_base(budget: StepBudget | None, given: EngineConfig) -> EngineConfig:
    """A base config carrying `budget`, bent to what the user set in `given` (their
    settings applied on the plain defaults), so that applying them again on it is valid."""
    base = EngineConfig()
    if budget is None:
        return base
    sc = given.scheduler
    chunk = min(budget.long_prefill_token_threshold, sc.max_num_batched_tokens)
    tokens = max(budget.max_num_batched_tokens, sc.long_prefill_token_threshold)
    if not sc.enable_chunked_prefill:
        tokens = max(tokens, sc.max_model_len)  # whole prompts in one step
    return base.replace(max_num_batched_tokens=tokens, long_prefill_token_threshold=chunk)


def runner_hardware(runner) -> Hardware:
    """The hardware a TorchRunner runs on."""
    import torch

    device = runner.device
    if device.type != "cpu":
        return Hardware(device.type)
    return Hardware("cpu", torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())


def prefill_params(args) -> int:
    """Parameters a prompt token passes through: all but the embedding table and an
    untied head (both counted in num_parameters; the head runs on sampled rows only)."""
    tables = 1 if args.tie_word_embeddings else 2
    return args.num_parameters - tables * args.vocab_size * args.hidden_size
