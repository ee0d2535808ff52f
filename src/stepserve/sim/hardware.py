"""Accelerator presets for the roofline cost model. Peak numbers are the vendors'
dense bf16 tensor FLOP/s and memory bandwidth; the efficiencies say how much of the
peak a serving engine reaches (assumptions, printed with every simulated result).

`host_link_bandwidth` is what a KV block copy between device and host memory reaches
(swap out, swap in): PCIe Gen5 x16 peaks at 64 GB/s a direction and copies reach about
50; Gen4 x16 32 and about 25. It prices swap against recompute: swapping a sequence's KV
costs its bytes over this link twice, recomputing it costs its prefill again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_bytes: int
    flops_efficiency: float = 0.5  # share of peak FLOP/s reached in prefill (MFU)
    bandwidth_efficiency: float = 0.7  # share of peak bandwidth reached in decode (MBU)
    step_overhead_s: float = 0.004  # scheduling, sampling, launch: per step, fixed
    memory_utilization: float = 0.9  # share of memory the engine may use (weights + KV)
    host_link_bandwidth: float = 25e9  # bytes/s a device <-> host KV copy reaches
    # An engine that overlaps scheduling with the GPU (vLLM v1) hides its per-sequence and
    # per-join work; one that does not pays it every step (sim/cost.py SchedulingOverhead).
    seq_overhead_s: float = 0.0  # per scheduled sequence
    join_overhead_s: float = 0.0  # per request joining the batch

    def describe(self) -> str:
        extra = "".join(
            f" + {seconds * 1e6:g} us/{unit}" for seconds, unit in (
                (self.seq_overhead_s, "sequence"), (self.join_overhead_s, "join"))
            if seconds)
        return (f"{self.name}: {self.peak_flops / 1e12:g} TFLOP/s x {self.flops_efficiency:g}, "
                f"{self.memory_bandwidth / 1e12:g} TB/s x {self.bandwidth_efficiency:g}, "
                f"{self.memory_bytes / 1e9:g} GB x {self.memory_utilization:g}, "
                f"{self.step_overhead_s * 1e3:g} ms/step overhead{extra}, "
                f"host link {self.host_link_bandwidth / 1e9:g} GB/s")


_GB = 10**9
HARDWARE: dict[str, HardwareSpec] = {h.name: h for h in (
    HardwareSpec("h100", 989e12, 3.35e12, 80 * _GB, host_link_bandwidth=50e9),
    HardwareSpec("h200", 989e12, 4.8e12, 141 * _GB, host_link_bandwidth=50e9),
    HardwareSpec("a100", 312e12, 2.039e12, 80 * _GB),
    HardwareSpec("a100-40gb", 312e12, 1.555e12, 40 * _GB),
    HardwareSpec("l40s", 362e12, 0.864e12, 48 * _GB),
    # This project's CI machine kind: 2 cores, ~23 GB/s measured (DESIGN.md section 3); a
    # "swap" there is a copy within host memory, reading and writing: half of that.
    HardwareSpec("cpu-2core", 1.0e11, 23e9, 24 * _GB, flops_efficiency=0.5,
                 bandwidth_efficiency=0.8, step_overhead_s=0.003, memory_utilization=0.5,
                 host_link_bandwidth=11.5e9),
)}


def get_hardware(name: str) -> HardwareSpec:
    hw = HARDWARE.get(name.strip().lower())
    if hw is None:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return hw
