"""TorchRunner on the tiny preset against transformers, token for token, with chunked
prefill mixed with decodes; swap round trip; the runner leaves requests alone."""

from __future__ import annotations

import pytest
import torch

from stepserve.core.output import SchedulerOutput
from stepserve.model.runner import TorchRunner
from stepserve.request import Request


def tiny_prompts(n: int = 16, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 100, 7, 8, 15, 64, 33, 1, 2, 50, 17, 90, 6, 40, 9, 77][:n]
    return [torch.randint(3, 512, (L,), generator=g).tolist() for L in lengths]


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir, reference):
    return reference(tiny_dir, tiny_prompts(), 20)


@pytest.mark.parametrize("block_size,chunk,admit", [(16, 7, 2), (4, 5, 3), (32, 1000, 16)])
def test_tiny_matches_transformers(tiny_dir, driver, hf_tiny, block_size, chunk, admit):
    runner = TorchRunner(tiny_dir, block_size=block_size, num_gpu_blocks=512)
    got = driver(runner, tiny_prompts(), 20, chunk=chunk, admit_per_step=admit)
    assert got == hf_tiny
