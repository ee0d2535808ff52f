"""The paged KV cache tensors (`[num_layers, 2, num_blocks, block_size, kv_heads, head_dim]`,
so a swap moves a block of every layer in one op), the CPU swap pool, and how many blocks
a memory budget buys. Blocks start zeroed: a masked NaN in a pad would still poison
`probs @ V`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from stepserve.model.model_args import ModelArgs

GiB = 1 << 30


class KVStore:
    def __init__(self, args: ModelArgs, num_blocks: int, block_size: int,
                 num_cpu_blocks: int = 0, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks = {num_blocks}: must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self.device = torch.device(device)
        per_block = (block_size, args.num_kv_heads, args.head_dim)
        self.kv = torch.zeros((args.num_layers, 2, num_blocks, *per_block), dtype=dtype,
                              device=self.device)
        # Pinned host memory lets CUDA copies run at full PCIe speed; plain memory on CPU.
        pin = self.device.type == "cuda"
        self.cpu_kv = torch.zeros((args.num_layers, 2, num_cpu_blocks, *per_block),
                                  dtype=dtype, pin_memory=pin)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of layer i, each [num_blocks, block_size, kv_heads, head_dim]."""
        return self.kv[i, 0], self.kv[i, 1]

    def copy_blocks_to_cpu(self, pairs: list[tuple[int, int]]) -> None:
        """Swap out: (device block, cpu block) pairs, as in SchedulerOutput.swap_out."""
        if not pairs:
            return
        dev = torch.tensor([d for d, _ in pairs], device=self.device)
        cpu = torch.tensor([c for _, c in pairs])
        self.cpu_kv[:, :, cpu] = self.kv[:, :, dev].to("cpu")

    def copy_blocks_from_cpu(self, pairs: list[tuple[int, int]]) -> None:
        """Swap in: (cpu block, device block) pairs, as in SchedulerOutput.swap_in."""
        if not pairs:
            return
        cpu = torch.tensor([c for c, _ in pairs])
        dev = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv[:, :, dev] = self.cpu_kv[:, :, cpu].to(self.device, non_blocking=True)


def num_blocks_for_memory(num_bytes: int, args: ModelArgs, block_size: int) -> int:
    """How many KV blocks of `block_size` tokens fit in `num_bytes`."""
    return num_bytes // (args.kv_bytes_per_token * block_size)


@dataclass(frozen=True)
class KVBudget:
    """A KV cache size and where it came from, for the startup log."""

    num_bytes: int
    reason: str

    def describe(self, args: ModelArgs, block_size: int) -> str:
        blocks = num_blocks_for_memory(self.num_bytes, args, block_size)
        return (f"KV cache {self.num_bytes / GiB:.2f} GiB = {blocks} blocks x {block_size} "
                f"tokens ({blocks * block_size} tokens, "
                f"{args.kv_bytes_per_token / 1024:.1f} KiB/token); {self.reason}")


def memory_total_and_free(device: str | torch.device = "cpu") -> tuple[int, int] | None:
    """(total, free) bytes of the device's memory now; on CPU the machine's MemTotal
    and MemAvailable. None where they cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    try:
        with open("/proc/meminfo") as f:
            kib = {name: value.split()[0] for name, value in (line.split(":", 1) for line in f)}
        return int(kib["MemTotal"]) * 1024, int(kib["MemAvailable"]) * 1024
    except (OSError, KeyError):
        return None


def process_rss() -> int | None:
    """Bytes of memory this process holds now (VmRSS); None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def utilization_kv_budget(fraction: float, device: str | torch.device = "cpu") -> KVBudget:
    """vLLM's --gpu-memory-utilization. On CPU as vLLM's CPU build takes it: this
    process may hold `fraction` of the machine's RAM, and the KV cache gets that less what
    the process holds already (its weights, torch); other processes' memory does not
    count against the share, but the cache must fit in what is available now. On CUDA:
    `fraction` of the device, less everything in use on it. Call after the weights are
    loaded. Unlike vLLM there is no profiling run, so activations are not set aside: leave
    them room. ValueError when nothing is left, or the cache would not fit."""
    device = torch.device(device)
    sizes = memory_total_and_free(device)
    if sizes is None:
        raise ValueError("gpu_memory_utilization: this machine's memory size cannot be "
                         "read (no /proc/meminfo); give kv_cache_memory instead")
    total, free = sizes
    share = int(total * fraction)
    where = "RAM" if device.type == "cpu" else str(device)
    head = (f"gpu_memory_utilization = {fraction:g}: {fraction:.0%} of {total / GiB:.1f} GiB "
            f"of {where} is {share / GiB:.2f} GiB")
    if device.type == "cpu":
        held = process_rss()
        if held is None:
            raise ValueError(f"{head}, but this process's memory cannot be read (no "
                             "/proc/self/status); give kv_cache_memory instead")
        budget = share - held
        if budget <= 0:
            raise ValueError(f"{head}, and this process holds {held / GiB:.2f} GiB already "
                             "(weights, torch); raise it or give kv_cache_memory")
        if budget > free:
            raise ValueError(f"{head}: a KV cache of {budget / GiB:.2f} GiB, but only "
                             f"{free / GiB:.2f} GiB of RAM is available; lower it or give "
                             "kv_cache_memory")
        return KVBudget(budget, f"gpu_memory_utilization {fraction:g} of {total / GiB:.1f} "
                                f"GiB RAM, less {held / GiB:.2f} GiB this process holds")
    used = total - free
    budget = share - used
    if budget <= 0:
        raise ValueError(f"{head}, but {used / GiB:.2f} GiB is in use already; raise it or "
                         "give kv_cache_memory")
    return KVBudget(budget, f"gpu_memory_utilization {fraction:g} of {total / GiB:.1f} GiB "
                            f"{where}, less {used / GiB:.2f} GiB in use")


CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's CPU build: GiB of KV cache


def env_kv_budget() -> KVBudget | None:
    """The KV size VLLM_CPU_KVCACHE_SPACE gives (whole GiB, as vLLM's CPU build reads
    it); None where it is unset or empty. ValueError for anything but a whole number > 0."""
    text = os.environ.get(CPU_KV_SPACE_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{CPU_KV_SPACE_ENV} = {text!r}: must be a whole number of GiB, "
                         ">= 1 (or unset)")
    return KVBudget(int(text) * GiB, f"{CPU_KV_SPACE_ENV}={text} (GiB)")


def default_kv_budget(device: str | torch.device = "cpu", cpu_fraction: float = 0.25,
                      cpu_cap: int = 4 * GiB, cuda_fraction: float = 0.8) -> KVBudget:
    """A KV budget when the user gave none. Call after the weights are loaded, so free
    memory already excludes them. CPU: a quarter of MemAvailable, at most 4 GiB (the
    cache shares RAM with everything else, and CPU decode is too slow to use more).
    CUDA: 80% of free device memory, leaving room for activations."""
    device = torch.device(device)
    sizes = memory_total_and_free(device)
    if device.type == "cuda" and sizes is not None:
        return KVBudget(int(sizes[1] * cuda_fraction),
                        f"{cuda_fraction:.0%} of {sizes[1] / GiB:.1f} GiB free on {device}")
    # not Linux: assume a small machine rather than guess high
    avail = 2 * cpu_cap if sizes is None else sizes[1]
    source = "MemAvailable unknown" if sizes is None else f"MemAvailable {avail / GiB:.1f} GiB"
    budget = min(int(avail * cpu_fraction), cpu_cap)
    capped = " (capped)" if budget == cpu_cap else ""
    return KVBudget(budget, f"{cpu_fraction:.0%} of {source}, at most "
                            f"{cpu_cap / GiB:.0f} GiB{capped}")


def kv_blocks(args: ModelArgs, block_size: int, device: torch.device,
              num_gpu_blocks: int | None, kv_cache_memory: int | None,
              gpu_memory_utilization: float | None) -> tuple[KVBudget, int]:
    """The KV budget and its device blocks, from the first setting given: a block count,
    a byte size, on CPU the VLLM_CPU_KVCACHE_SPACE variable (as vLLM's CPU build, it wins
    over the memory fraction; the settings, given on purpose, win over it), a memory
    fraction, else the default. Call after the weights are loaded. ValueError where the
    budget holds no block."""
    if num_gpu_blocks is not None:
        return KVBudget(num_gpu_blocks * block_size * args.kv_bytes_per_token,
                        "num_gpu_blocks as configured"), num_gpu_blocks
    if kv_cache_memory:
        budget = KVBudget(kv_cache_memory, "kv_cache_memory as configured")
    elif device.type == "cpu" and (env := env_kv_budget()) is not None:
        budget = env
    elif gpu_memory_utilization:
        budget = utilization_kv_budget(gpu_memory_utilization, device)
    else:
        budget = default_kv_budget(device)
    blocks = num_blocks_for_memory(budget.num_bytes, args, block_size)
    if blocks < 1:
        raise ValueError(f"KV budget {budget.num_bytes} bytes holds no block of {block_size} "
                         f"tokens ({args.kv_bytes_per_token} bytes/token)")
    return budget, blocks
