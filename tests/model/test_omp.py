"""model/omp.py: the thread that loaded the model gives its OpenMP workers up before the
server's engine thread steps it (one pool per core-sharing process, see the module)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from stepserve.model.omp import release_openmp_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts threads in /proc/self/task")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_the_calling_threads_workers_are_freed_and_come_back_when_needed():
    torch.set_num_threads(2)
    x = torch.randn(1 << 22)
    (x * 2).sum()  # a parallel region: this thread's pool has its worker now
    with_pool = _threads()
    assert release_openmp_pool()
    assert _threads() == with_pool - 1  # the one worker of a 2-thread team is gone
    (x * 2).sum()
    assert _threads() == with_pool  # a new region brings the pool back
