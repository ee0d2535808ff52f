"""Check the roofline presets against published measurements.

Each row of MEASUREMENTS below is one public number (a step time, a per-token latency,
a time to first token or a throughput) with its source. For each, this script builds the
batches the published run executed (`SchedulerOutput`s of `Request`s: a prefill of B
prompts of P tokens, then the decode steps of B sequences, or a small vLLM-style
chunked-prefill schedule), asks `RooflineCost.step_time` what they cost with the preset
hardware and model specs, converts the sum to the published unit and prints the error.
It only evaluates the formula: no GPU, a few seconds.

    python benchmarks/roofline_check.py [--json OUT] [--gpu h100]
    python benchmarks/roofline_check.py --mbu 0.8 --overhead-ms 2   # what-if efficiencies

FP8 rows (TensorRT-LLM runs with FP8 weights and FP8 KV cache) are evaluated with the
model's bytes per weight and per KV element set to 1 and the preset's peak FLOP/s doubled
(Hopper and Ada dense FP8 is twice dense BF16): an adaptation made here, not in the
presets. They are reported apart from the BF16/FP16 rows. See docs/roofline_checks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace

from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.plan.model_specs import get_model_spec
from stepserve.sim.roofline import HardwareSpec, RooflineCost, get_hardware

# Sources (full citations, with what each figure means, in docs/roofline_checks.md).
TRTLLM_PERF = ("NVIDIA/TensorRT-LLM docs/source/performance.md @ 138f96d45f90b9667426f7c47297d8c06bafac73 "
               "(throughput tables 'updated for v0.6.1'; L40S throughput and all first-token "
               "latencies 'from TensorRT-LLM v0.5'; gptSessionBenchmark, static batch)")
TRTLLM_H200 = ("NVIDIA/TensorRT-LLM docs/source/blogs/H200launch.md @ 1555478c1b417a0b34de05209862ea5a2ab9add1 "
               "(TensorRT-LLM v0.5.0, 'H200 FP8 Max throughput' table)")
GPT_FAST = ("pytorch-labs/gpt-fast README.md @ 0f925b5d4ce457b89a7ca6c9ce50f42bf2576945 "
            "(8xA100-80GB power-limited to 330 W, batch 1, 5-token prompt, generate.py "
            "defaults: 200 new tokens)")
TORCHAO_B1 = ("pytorch/ao torchao/quantization/README.md @ 886ac8e90e14592b2afc3a8fc62af9a71996954a "
              "(torchao/_models/llama/generate.py --compile, batch 1, prompt 'Hello, my name is', "
              "200 new tokens)")
TORCHAO_VLLM = ("pytorch/ao torchao/quantization/README.md @ bcb3ff6af3349725b1f64d1f05cf29e8b0af4580 "
                "('NVIDIA H100' table, torch 2.9.0 + vllm 0.13.0, `vllm bench throughput "
                "--dtype bfloat16`, command in benchmarks/quantization/"
                "measure_accuracy_and_performance.sh)")
VLLM_LATENCY = ("vLLM performance benchmark, latency_llama8B_tp1 (benchmark_latency: batch 8, "
                "input 32, output 128, dummy weights, bf16; definition in vllm-project/vllm "
                ".buildkite/nightly-benchmarks/tests/latency-tests.json @ "
                "d5ce92492d5188cd0b5f4fcf70ef54a7dfbdba05), {url}")
ACCELMARK = ("FreedomIntelligence/AccelMark @ 5797fc42745be2494e6213938d9e5afa0c6c5bef "
             "results/verified/{dir}/interactive/result.json (vLLM 0.7.3, BF16, one request at "
             "a time, streamed; TPOT = (latency - TTFT) / (output - 1))")

ACCEL_A = {"a100": "nvidia_a100_sxm4_80gbx1_suite_A_nvidia_vllm_47f5d58e_ed4b0557",
           "a100-40gb": "nvidia_a100_sxm4_40gbx1_suite_A_nvidia_vllm_47f5d58e_b4a92b30",
           "h100": "nvidia_h100_80gb_hbm3x1_suite_A_nvidia_vllm_47f5d58e_831c95a7",
           "h200": "nvidia_h200x1_suite_A_nvidia_vllm_47f5d58e_29b2ec38"}
ACCEL_D = {"a100": "nvidia_a100_sxm4_80gbx1_suite_D_nvidia_vllm_47f5d58e_7bef8eef",
           "a100-40gb": "nvidia_a100_sxm4_40gbx1_suite_D_nvidia_vllm_47f5d58e_8e114cbe",
           "h100": "nvidia_h100_80gb_hbm3x1_suite_D_nvidia_vllm_47f5d58e_02748da4",
           "h200": "nvidia_h200x1_suite_D_nvidia_vllm_47f5d58e_62a36028"}
# AccelMark's request distributions (suites/suite_{A,D}/suite.json): suite A ShareGPT
# input p50 280, output p50 310; suite D input p50 28,650, output 256.
SUITE_A_IN, SUITE_A_OUT = 280, 310
SUITE_D_IN, SUITE_D_OUT = 28_650, 256

# What each kind of row measures, and so how the predicted batches are turned into it:
#   ttft         ms: one prefill step of `batch` prompts of `input_len` tokens
#   tpot         ms/token: mean of the output_len - 1 decode steps after that prefill
#   stream_tok_s tok/s: batch * output_len / (prefill + all decode steps)   (batch 1)
#   latency_ms   ms: prefill + all decode steps of one static batch
#   static_tok_s tok/s: batch * output_len / (prefill + all decode steps)
#   offline_tok_s tok/s: batch * (input_len + output_len) / time of a vLLM-V1-like
#                chunked-prefill schedule (token budget `budget`, at most `max_seqs` running)
KIND_UNIT = {"ttft": "ms", "tpot": "ms/tok", "stream_tok_s": "tok/s", "latency_ms": "ms",
             "static_tok_s": "tok/s", "offline_tok_s": "tok/s"}


@dataclass(frozen=True)
class Measurement:
    key: str
    gpu: str  # hardware preset
    model: str  # model spec
    precision: str  # bf16 | fp16 | fp8
    engine: str
    kind: str
    batch: int
    input_len: int
    output_len: int
    published: float
    source: str
    note: str = ""
    budget: int = 0  # offline_tok_s: max_num_batched_tokens
    max_seqs: int = 0  # offline_tok_s: max_num_seqs

    @property
    def unit(self) -> str:
        return KIND_UNIT[self.kind]

    @property
    def point(self) -> str:
        b, i, o = self.batch, f"{self.input_len:,}", f"{self.output_len:,}"
        return {"ttft": f"ttft {b}x{i}",
                "tpot": f"tpot B={b} {i}+{o}",
                "offline_tok_s": f"offline {b}x({i}+{o})"}.get(self.kind, f"gen B={b} {i}+{o}")


def _m(*args, **kw) -> Measurement:
    return Measurement(*args, **kw)


MEASUREMENTS: tuple[Measurement, ...] = (
    # ---------------- A100 SXM4 80 GB ----------------
    _m("a100-gptfast-b1", "a100", "llama-2-7b", "bf16", "gpt-fast (torch.compile)",
       "stream_tok_s", 1, 5, 200, 104.9, GPT_FAST, "GPU power-limited to 330 W"),
    _m("a100-torchao-b1", "a100", "llama-3-8b", "bf16", "torchao generate.py (compile)",
       "stream_tok_s", 1, 6, 200, 95.64, TORCHAO_B1),
    _m("a100-vllm-latency-b8", "a100", "llama-3-8b", "bf16", "vLLM benchmark_latency",
       "latency_ms", 8, 32, 128, 1579.27,
       VLLM_LATENCY.format(url="https://buildkite.com/vllm/performance-benchmark/builds/9523 "
                               "(A100-SXM4-80GB, mean latency)")),
    _m("a100-accelmark-tpot", "a100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_A_IN, SUITE_A_OUT, 13.19,
       ACCELMARK.format(dir=ACCEL_A["a100"]) + " suite A, tpot_ms_p50",
       "ShareGPT lengths: p50 input and output used"),
    _m("a100-accelmark-ttft-28k", "a100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "ttft", 1, SUITE_D_IN, SUITE_D_OUT, 2838.69,
       ACCELMARK.format(dir=ACCEL_D["a100"]) + " suite D, ttft_ms_p50",
       "Llama-3.1-8B; p50 input length used"),
    _m("a100-accelmark-tpot-28k", "a100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_D_IN, SUITE_D_OUT, 30.57,
       ACCELMARK.format(dir=ACCEL_D["a100"]) + " suite D, tpot_ms_p50",
       "Llama-3.1-8B; slower than the 40 GB card (17.96) in the same harness: suspect run"),
    _m("a100-trtllm-ttft-128", "a100", "llama-2-7b", "fp16", "TensorRT-LLM v0.5",
       "ttft", 1, 128, 1, 16, TRTLLM_PERF),
    _m("a100-trtllm-ttft-2048", "a100", "llama-2-7b", "fp16", "TensorRT-LLM v0.5",
       "ttft", 1, 2048, 1, 133, TRTLLM_PERF),
    _m("a100-trtllm-384x128x128", "a100", "llama-2-7b", "fp16", "TensorRT-LLM v0.6.1",
       "static_tok_s", 384, 128, 128, 5586, TRTLLM_PERF),
    _m("a100-trtllm-60x128x2048", "a100", "llama-2-7b", "fp16", "TensorRT-LLM v0.6.1",
       "static_tok_s", 60, 128, 2048, 1928, TRTLLM_PERF),
    _m("a100-trtllm-52x2048x128", "a100", "llama-2-7b", "fp16", "TensorRT-LLM v0.6.1",
       "static_tok_s", 52, 2048, 128, 591, TRTLLM_PERF),
    # ---------------- A100 SXM4 40 GB ----------------
    _m("a100-40gb-accelmark-tpot", "a100-40gb", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_A_IN, SUITE_A_OUT, 14.27,
       ACCELMARK.format(dir=ACCEL_A["a100-40gb"]) + " suite A, tpot_ms_p50",
       "ShareGPT lengths: p50 input and output used"),
    _m("a100-40gb-accelmark-ttft-28k", "a100-40gb", "llama-3-8b", "bf16",
       "vLLM 0.7.3 server", "ttft", 1, SUITE_D_IN, SUITE_D_OUT, 2822.72,
       ACCELMARK.format(dir=ACCEL_D["a100-40gb"]) + " suite D, ttft_ms_p50",
       "Llama-3.1-8B; p50 input length used"),
    _m("a100-40gb-accelmark-tpot-28k", "a100-40gb", "llama-3-8b", "bf16",
       "vLLM 0.7.3 server", "tpot", 1, SUITE_D_IN, SUITE_D_OUT, 17.96,
       ACCELMARK.format(dir=ACCEL_D["a100-40gb"]) + " suite D, tpot_ms_p50", "Llama-3.1-8B"),
    # ---------------- H100 SXM5 80 GB ----------------
    _m("h100-torchao-b1", "h100", "llama-3-8b", "bf16", "torchao generate.py (compile)",
       "stream_tok_s", 1, 6, 200, 126.90, TORCHAO_B1, "Llama-3.1-8B; 'NVIDIA-H100'"),
    _m("h100-vllm-latency-b8", "h100", "llama-3-8b", "bf16", "vLLM benchmark_latency",
       "latency_ms", 8, 32, 128, 997.542,
       VLLM_LATENCY.format(url="https://buildkite.com/vllm/performance-benchmark/builds/9555 "
                               "(8xH100 node, TP 1, mean latency)")),
    _m("h100-accelmark-tpot", "h100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_A_IN, SUITE_A_OUT, 7.74,
       ACCELMARK.format(dir=ACCEL_A["h100"]) + " suite A, tpot_ms_p50",
       "ShareGPT lengths: p50 input and output used"),
    _m("h100-accelmark-ttft-28k", "h100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "ttft", 1, SUITE_D_IN, SUITE_D_OUT, 1076.72,
       ACCELMARK.format(dir=ACCEL_D["h100"]) + " suite D, ttft_ms_p50",
       "Llama-3.1-8B; p50 input length used"),
    _m("h100-accelmark-tpot-28k", "h100", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_D_IN, SUITE_D_OUT, 11.88,
       ACCELMARK.format(dir=ACCEL_D["h100"]) + " suite D, tpot_ms_p50", "Llama-3.1-8B"),
    _m("h100-vllm013-prefill", "h100", "llama-3-8b", "bf16", "vLLM 0.13.0 (V1)",
       "offline_tok_s", 32, 4096, 32, 30946.5, TORCHAO_VLLM + ", 'prefill toks/s'",
       "Llama-3.1-8B; read as total (input+output) tok/s; vLLM H100 defaults "
       "16,384 tokens/step, 1,024 seqs", budget=16384, max_seqs=1024),
    _m("h100-vllm013-decode", "h100", "llama-3-8b", "bf16", "vLLM 0.13.0 (V1)",
       "offline_tok_s", 128, 32, 2048, 6612, TORCHAO_VLLM + ", 'decode toks/s'",
       "Llama-3.1-8B; read as total tok/s (as output tok/s: time 1.6% shorter)",
       budget=16384, max_seqs=1024),
    _m("h100-trtllm-fp8-ttft-128", "h100", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "ttft", 1, 128, 1, 7, TRTLLM_PERF),
    _m("h100-trtllm-fp8-ttft-2048", "h100", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "ttft", 1, 2048, 1, 36, TRTLLM_PERF),
    _m("h100-trtllm-fp8-768x128x128", "h100", "llama-2-7b", "fp8", "TensorRT-LLM v0.6.1",
       "static_tok_s", 768, 128, 128, 19694, TRTLLM_PERF),
    _m("h100-trtllm-fp8-112x128x2048", "h100", "llama-2-7b", "fp8", "TensorRT-LLM v0.6.1",
       "static_tok_s", 112, 128, 2048, 6818, TRTLLM_PERF),
    _m("h100-trtllm-fp8-80x2048x128", "h100", "llama-2-7b", "fp8", "TensorRT-LLM v0.6.1",
       "static_tok_s", 80, 2048, 128, 2244, TRTLLM_PERF),
    # ---------------- H200 SXM 141 GB ----------------
    _m("h200-vllm-latency-b8", "h200", "llama-3-8b", "bf16", "vLLM benchmark_latency",
       "latency_ms", 8, 32, 128, 834.059,
       VLLM_LATENCY.format(url="https://buildkite.com/vllm/performance-benchmark/builds/9513 "
                               "(H200, mean latency)")),
    _m("h200-accelmark-tpot", "h200", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "tpot", 1, SUITE_A_IN, SUITE_A_OUT, 7.62,
       ACCELMARK.format(dir=ACCEL_A["h200"]) + " suite A, tpot_ms_p50",
       "ShareGPT lengths: p50 input and output used"),
    _m("h200-accelmark-ttft-28k", "h200", "llama-3-8b", "bf16", "vLLM 0.7.3 server",
       "ttft", 1, SUITE_D_IN, SUITE_D_OUT, 1165.86,
       ACCELMARK.format(dir=ACCEL_D["h200"]) + " suite D, ttft_ms_p50",
       "Llama-3.1-8B; p50 input length used"),
    _m("h200-trtllm-fp8-1024x128x128", "h200", "llama-2-13b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 1024, 128, 128, 11819, TRTLLM_H200),
    _m("h200-trtllm-fp8-128x128x2048", "h200", "llama-2-13b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 128, 128, 2048, 4750, TRTLLM_H200),
    _m("h200-trtllm-fp8-64x2048x128", "h200", "llama-2-13b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 64, 2048, 128, 1349, TRTLLM_H200),
    # ---------------- L40S 48 GB (FP8 only: no BF16 figure found) ----------------
    _m("l40s-trtllm-fp8-ttft-128", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "ttft", 1, 128, 1, 14, TRTLLM_PERF),
    _m("l40s-trtllm-fp8-ttft-2048", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "ttft", 1, 2048, 1, 73, TRTLLM_PERF),
    _m("l40s-trtllm-fp8-64x128x128", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 64, 128, 128, 3240, TRTLLM_PERF),
    _m("l40s-trtllm-fp8-64x128x2048", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 64, 128, 2048, 1622, TRTLLM_PERF),
    _m("l40s-trtllm-fp8-32x2048x128", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 32, 2048, 128, 581, TRTLLM_PERF),
    _m("l40s-trtllm-fp8-16x2048x2048", "l40s", "llama-2-7b", "fp8", "TensorRT-LLM v0.5",
       "static_tok_s", 16, 2048, 2048, 531, TRTLLM_PERF),
)

GPU_ORDER = ("a100", "a100-40gb", "h100", "h200", "l40s")


def cost_model(m: Measurement, overrides: dict) -> RooflineCost:
    """The preset's roofline for this row: FP8 rows get 1-byte weights/KV and 2x FLOP/s;
    `overrides` (what-if efficiencies) replace the preset's values, here only."""
    hw: HardwareSpec = get_hardware(m.gpu)
    spec = get_model_spec(m.model)
    if m.precision == "fp8":
        hw = replace(hw, peak_flops=hw.peak_flops * 2)
        spec = replace(spec, dtype_bytes=1)
    if overrides:
        hw = replace(hw, **overrides)
    return RooflineCost(hw, spec)


def _requests(n: int, prompt: int, output: int) -> list[Request]:
    params = SamplingParams(max_tokens=max(output, 1), ignore_eos=True)
    return [Request(f"r{i}", [1] * prompt, params, 0.0) for i in range(n)]


def step_work(cost: RooflineCost, out: SchedulerOutput) -> tuple[float, float]:
    """(FLOPs, bytes) of one step, the two numerators of RooflineCost.step_time (see
    its module docstring); used here only to say which bound a step hit and what
    efficiency a measured time implies."""
    m = cost.model
    tokens = attn = context = 0
    for req, n in zip(out.requests, out.num_scheduled_tokens):
        start = req.num_computed_tokens
        tokens += n
        attn += n * (start + (n + 1) * 0.5)
        context += start + n
    flops = 2.0 * m.num_params * tokens + 4.0 * m.num_layers * m.num_heads * m.head_dim * attn
    return flops, m.weight_bytes + context * m.kv_bytes_per_token


def static_batch(cost: RooflineCost, batch: int, prompt: int, output: int) -> dict:
    """One prefill step of `batch` prompts (it samples each sequence's first token), then
    output - 1 decode steps of `batch` sequences. Times in seconds, plus the work."""
    hw = cost.hardware
    reqs = _requests(batch, prompt, output)
    first = SchedulerOutput(0, reqs, [prompt] * batch)
    prefill = cost.step_time(first)
    prefill_flops, prefill_bytes = step_work(cost, first)
    compute_s = prefill_flops / (hw.peak_flops * hw.flops_efficiency)
    memory_s = prefill_bytes / (hw.memory_bandwidth * hw.bandwidth_efficiency)
    # step_work must stay the formula step_time evaluates (guards against roofline.py drifting)
    assert abs(hw.step_overhead_s + max(compute_s, memory_s) - prefill) <= 1e-9 * prefill, \
        "step_work no longer matches RooflineCost.step_time"
    prefill_compute_bound = compute_s > memory_s
    decode, memory_bound, decode_bytes = 0.0, 0, 0.0
    out = SchedulerOutput(1, reqs, [1] * batch)
    for j in range(1, output):
        for r in reqs:  # before decode step j each sequence holds prompt + j - 1 tokens
            r.num_computed_tokens = prompt + j - 1
        decode += cost.step_time(out)
        flops, nbytes = step_work(cost, out)
        decode_bytes += nbytes
        memory_bound += nbytes / (hw.memory_bandwidth * hw.bandwidth_efficiency) >= \
            flops / (hw.peak_flops * hw.flops_efficiency)
    steps = output - 1
    return {"prefill_s": prefill, "decode_s": decode, "decode_steps": steps,
            "memory_bound_decode_steps": memory_bound, "prefill_flops": prefill_flops,
            "prefill_compute_bound": prefill_compute_bound,
            "mean_decode_bytes": decode_bytes / steps if steps else 0.0}


def chunked_schedule(cost: RooflineCost, n: int, prompt: int, output: int, budget: int,
                     max_seqs: int) -> dict:
    """A vLLM-V1-like schedule: each step first gives every running decode its token,
    then continues running prefills, then admits waiting requests (FCFS), chunking
    prompts to fit `budget` tokens; at most `max_seqs` requests run."""
    reqs = _requests(n, prompt, output)
    done_prefill = [0] * n  # prompt tokens computed
    generated = [0] * n
    waiting, running = list(range(n)), []
    total, steps = 0.0, 0
    while waiting or running:
        left = budget
        batch, counts, prefill_of = [], [], []
        for i in running:
            if done_prefill[i] == prompt and left > 0:
                reqs[i].num_computed_tokens = prompt + generated[i] - 1
                batch.append(reqs[i])
                counts.append(1)
                prefill_of.append(0)
                left -= 1
        for i in running:
            if done_prefill[i] < prompt and left > 0:
                chunk = min(prompt - done_prefill[i], left)
                reqs[i].num_computed_tokens = done_prefill[i]
                batch.append(reqs[i])
                counts.append(chunk)
                prefill_of.append(chunk)
                left -= chunk
        while waiting and len(running) < max_seqs and left > 0:
            i = waiting.pop(0)
            running.append(i)
            chunk = min(prompt, left)
            reqs[i].num_computed_tokens = 0
            batch.append(reqs[i])
            counts.append(chunk)
            prefill_of.append(chunk)
            left -= chunk
        total += cost.step_time(SchedulerOutput(steps, batch, counts))
        steps += 1
        for r, chunk in zip(batch, prefill_of):
            i = int(r.request_id[1:])
            if chunk:
                done_prefill[i] += chunk
                if done_prefill[i] == prompt:
                    generated[i] = 1  # the prefill's last chunk samples the first token
            else:
                generated[i] += 1
        running = [i for i in running if generated[i] < output]
    return {"time_s": total, "steps": steps}


def predict(m: Measurement, overrides: dict) -> dict:
    cost = cost_model(m, overrides)
    hw = cost.hardware
    if m.kind == "offline_tok_s":
        sched = chunked_schedule(cost, m.batch, m.input_len, m.output_len, m.budget,
                                 m.max_seqs)
        t = sched["time_s"]
        return {"predicted": m.batch * (m.input_len + m.output_len) / t, "time_s": t,
                "implied": "", "detail": f"{sched['steps']} steps"}
    s = static_batch(cost, m.batch, m.input_len, m.output_len)
    whole = s["prefill_s"] + s["decode_s"]
    steps = s["decode_steps"]
    if m.kind == "ttft":
        pred, t = s["prefill_s"] * 1e3, s["prefill_s"]
        busy = m.published / 1e3 - hw.step_overhead_s
        implied = ""
        if s["prefill_compute_bound"] and busy > 0:
            implied = f"MFU {s['prefill_flops'] / (hw.peak_flops * busy):.2f}"
    else:
        if m.kind == "tpot":
            t = s["decode_s"] / steps
            pred = t * 1e3
            measured_step = m.published / 1e3
        elif m.kind == "latency_ms":
            pred, t = whole * 1e3, whole
            measured_step = (m.published / 1e3 - s["prefill_s"]) / steps
        else:  # stream_tok_s, static_tok_s
            pred, t = m.batch * m.output_len / whole, whole
            measured_step = (m.batch * m.output_len / m.published - s["prefill_s"]) / steps
        # decode-dominated rows: the share of peak bandwidth the measured step time implies
        # if the whole step were weight + KV traffic (no overhead at all)
        decode_share = s["decode_s"] / whole
        implied = ""
        if (m.kind == "tpot" or m.kind != "static_tok_s" and decode_share > 0.9) \
                and measured_step > 0:
            implied = f"BW {s['mean_decode_bytes'] / (hw.memory_bandwidth * measured_step):.2f}"
    detail = (f"prefill {s['prefill_s'] * 1e3:.1f} ms + {steps} decode steps "
              f"{s['decode_s'] * 1e3:.1f} ms ({s['memory_bound_decode_steps']} memory-bound)")
    return {"predicted": pred, "time_s": t, "implied": implied, "detail": detail}


def measured_time(m: Measurement, pred: dict) -> float:
    """The published figure as the same duration the prediction's `time_s` is."""
    if m.unit == "tok/s":
        return pred["time_s"] * pred["predicted"] / m.published
    return m.published / 1e3


def evaluate(rows: tuple[Measurement, ...], overrides: dict) -> list[dict]:
    results = []
    for m in rows:
        p = predict(m, overrides)
        err = (p["predicted"] - m.published) / m.published * 100
        ratio = p["time_s"] / measured_time(m, p)
        results.append({**asdict(m), "unit": m.unit, "point": m.point,
                        "predicted": p["predicted"], "error_pct": err,
                        "time_ratio": ratio, "implied": p["implied"],
                        "detail": p["detail"]})
    return results


def summarize(results: list[dict]) -> list[dict]:
    out = []
    for gpu in GPU_ORDER:
        for group, precs in (("bf16/fp16", ("bf16", "fp16")), ("fp8 (adapted)", ("fp8",))):
            rs = [r for r in results if r["gpu"] == gpu and r["precision"] in precs]
            if not rs:
                continue
            out.append({"gpu": gpu, "group": group, "rows": len(rs),
                        "median_abs_error_pct": statistics.median(abs(r["error_pct"]) for r in rs),
                        "max_abs_error_pct": max(abs(r["error_pct"]) for r in rs),
                        "median_time_ratio": statistics.median(r["time_ratio"] for r in rs)})
    return out


def _fmt(x: float) -> str:
    return f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def print_table(results: list[dict], summary: list[dict]) -> None:
    head = (f"{'gpu':<10}{'model':<12}{'prec':<5} {'engine':<30}{'point':<26}"
            f"{'unit':>7}{'published':>11}{'predicted':>11}{'error %':>9}{'t pred/meas':>12}"
            f"  {'implied'}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['gpu']:<10}{r['model']:<12}{r['precision']:<5} {r['engine'][:29]:<30}"
              f"{r['point'][:25]:<26}{r['unit']:>7}{_fmt(r['published']):>11}"
              f"{_fmt(r['predicted']):>11}{r['error_pct']:>+9.1f}{r['time_ratio']:>12.2f}"
              f"  {r['implied']}".rstrip())
    print()
    print(f"{'preset':<10}{'rows':<15}{'n':>3}{'median |err| %':>16}{'max |err| %':>13}"
          f"{'median t pred/meas':>20}")
    for s in summary:
        print(f"{s['gpu']:<10}{s['group']:<15}{s['rows']:>3}{s['median_abs_error_pct']:>16.1f}"
              f"{s['max_abs_error_pct']:>13.1f}{s['median_time_ratio']:>20.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT", help="write rows, summary and settings as JSON")
    ap.add_argument("--gpu", choices=GPU_ORDER, help="only this preset's rows")
    ap.add_argument("--mfu", type=float, help="what-if flops_efficiency (default: preset)")
    ap.add_argument("--mbu", type=float, help="what-if bandwidth_efficiency (default: preset)")
    ap.add_argument("--overhead-ms", type=float, help="what-if step overhead (default: preset)")
    ap.add_argument("--details", action="store_true", help="print each row's step breakdown")
    args = ap.parse_args()
    overrides = {k: v for k, v in (("flops_efficiency", args.mfu),
                                   ("bandwidth_efficiency", args.mbu),
                                   ("step_overhead_s", None if args.overhead_ms is None
                                    else args.overhead_ms / 1e3)) if v is not None}
    rows = tuple(m for m in MEASUREMENTS if args.gpu in (None, m.gpu))
    t0 = time.perf_counter()
    results = evaluate(rows, overrides)
    summary = summarize(results)
    wall = time.perf_counter() - t0
    print(f"roofline presets vs {len(rows)} published measurements; "
          + (f"what-if {overrides}" if overrides else "preset efficiencies"))
    for gpu in GPU_ORDER:
        if any(r["gpu"] == gpu for r in results):
            print(f"  {replace(get_hardware(gpu), **overrides).describe()}")
    print("error %: (predicted - published) / published, in the published unit. "
          "t pred/meas: predicted / measured duration (> 1: the roofline is slower).\n"
          "implied: MFU a prefill's time implies at the step overhead above; BW: share of "
          "peak bandwidth a decode step's time implies with no overhead at all.\n")
    print_table(results, summary)
    if args.details:
        print()
        for r in results:
            print(f"{r['key']:<32}{r['detail']}")
    print(f"\nevaluated in {wall:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "roofline_check", "overrides": overrides,
                       "rows": results, "summary": summary}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
