"""How far a weight mode's greedy output agrees with a reference mode's: free-running (equal
tokens before the first difference) and teacher-forced (the candidate's argmax on the
reference's own output, each position one trial, with the reference's top-2 gap at a flip).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.model.paged_attention import build_attention_metadata
from stepserve.model.runner import TorchRunner

SEED_TEXTS = [
    "The capital of France is", "def fibonacci(n):\n    ", "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
    "Translate to French: Good morning, how are you today?", "List three primary colors:",
    "import numpy as np\nx = np.arange(10)\nprint(", "In 1969, Neil Armstrong",
    "My favourite programming language is Python because", "Water is made of hydrogen and",
    "The mitochondria is", "Write a haiku about the sea.", "The quick brown fox",
    "Explain in one sentence why the sky is blue.", "SELECT name, age FROM users WHERE",
    "A recipe for pancakes: first,", "The three laws of thermodynamics are",
    "Dear hiring manager, I am writing to apply for", "The derivative of x^2 is",
    "Summarize the plot of Romeo and Juliet.", "<html>\n  <head>\n    <title>",
    "Top 5 tips for learning a new language:", "The stock market closed today at",
    "Photosynthesis converts", "To be, or not to be, that is", "git commit -m \"",
    "The largest planet in the solar system is", "How do I reverse a list in Python?",
    "It was a dark and stormy night;", "The first president of the United States was",
    "Name a prime number larger than 10.",
]


def agreement_prompts(tokenizer, n: int) -> list[list[int]]:
    """`n` prompts: the starting texts as they are, then as chat turns, then repeated."""
    texts = [(t, False) for t in SEED_TEXTS] + [(t, True) for t in SEED_TEXTS]
    out = []
    for i in range(n):
        text, chat = texts[i % len(texts)]
        out.append(tokenizer.encode_chat([{"role": "user", "content": text}]) if chat
                   else tokenizer.encode(text))
    return out


@dataclass(frozen=True)
class Agreement:
    prompts: int
    max_tokens: int
    identical_sequences: int
    tokens_before_divergence: int  # summed over prompts; max prompts * max_tokens
    forced_positions: int
    forced_flips: int
    flip_gaps: list[float] = field(default_factory=list)  # reference top-2 gap per flip

    @property
    def forced_agreement(self) -> float:
        return 1 - self.forced_flips / self.forced_positions if self.forced_positions else 1.0

    def summary(self) -> dict[str, object]:
        return {"prompts": self.prompts, "max_tokens": self.max_tokens,
                "identical_sequences": self.identical_sequences,
                "tokens_before_divergence": self.tokens_before_divergence,
                "free_running_agreement": self.tokens_before_divergence
                / (self.prompts * self.max_tokens),
                "forced_positions": self.forced_positions, "forced_flips": self.forced_flips,
                "forced_agreement": self.forced_agreement,
                "median_flip_gap": statistics.median(self.flip_gaps) if self.flip_gaps else None,
                "max_flip_gap": max(self.flip_gaps, default=None)}


def greedy_generate(runner: TorchRunner, prompts: list[list[int]], max_tokens: int,
                    in_flight: int = 8, chunk: int = 64) -> list[list[int]]:
    """Greedy outputs, `in_flight` sequences at a time, prompts fed `chunk` tokens per
    step alongside the others' decodes (the batch shapes serving produces)."""
    mgr = KVCacheManager(runner.num_gpu_blocks, runner.block_size)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    waiting = [Request(f"g{i}", list(p), params, 0.0) for i, p in enumerate(prompts)]
    done = list(waiting)
    running: list[Request] = []
    step = 0
    while running or waiting:
        while waiting and len(running) < in_flight:
            running.append(waiting.pop(0))
        counts = [min(chunk, r.num_tokens - r.num_computed_tokens) for r in running]
        for r, n in zip(running, counts, strict=True):
            if not mgr.allocate_slots(r, n):
                raise ValueError("KV cache too small for the agreement run")
        out = runner.execute(SchedulerOutput(step, list(running), counts, block_tables=[
            mgr.block_table(r.request_id) for r in running]))
        for r, n, tok in zip(list(running), counts, out.sampled_token_ids, strict=True):
            r.num_computed_tokens += n
            if tok is not None:
                r.output_token_ids.append(tok)
            if r.num_output_tokens == max_tokens:
                mgr.free(r)
                running.remove(r)
        step += 1
    return [r.output_token_ids for r in done]


@torch.inference_mode()
def forced_logits(runner: TorchRunner, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Logits [len(output), vocab] predicting each output token, from one prefill of
    prompt + output[:-1] (blocks 0.. of the runner's KV store, which nothing else uses)."""
    ids = prompt + output[:-1]
    bs = runner.block_size
    table = list(range(-(-len(ids) // bs)))
    if len(table) > runner.num_gpu_blocks:
        raise ValueError("KV cache too small for the teacher-forced pass")
    meta, positions = build_attention_metadata([0], [len(ids)], [table], bs, runner.device,
                                               runner.args.sliding_window)
    rows = torch.arange(len(prompt) - 1, len(ids), device=runner.device)
    return runner.model(torch.tensor(ids, device=runner.device), positions, meta, runner.kv,
                        rows)


def measure_agreement(reference: TorchRunner, candidate: TorchRunner,
                      prompts: list[list[int]], max_tokens: int,
                      in_flight: int = 8) -> Agreement:
    want = greedy_generate(reference, prompts, max_tokens, in_flight)
    got = greedy_generate(candidate, prompts, max_tokens, in_flight)
    identical = sum(g == w for g, w in zip(got, want, strict=True))
    before = sum(next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), len(w))
                 for g, w in zip(got, want, strict=True))
    positions = flips = 0
    gaps: list[float] = []
    for prompt, out in zip(prompts, want, strict=True):
        ref = forced_logits(reference, prompt, out)
        cand = forced_logits(candidate, prompt, out).argmax(-1)
        top2 = ref.topk(2, dim=-1).values
        flipped = cand != ref.argmax(-1)
        positions += len(out)
        flips += int(flipped.sum())
        gaps += (top2[:, 0] - top2[:, 1])[flipped].tolist()
    return Agreement(len(prompts), max_tokens, identical, before, positions, flips, gaps)
