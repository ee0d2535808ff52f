"""OpenMP thread pools and the thread that steps the engine.

libgomp (torch's OpenMP runtime, which our kernels share) keeps one pool of worker threads
per thread that has started a parallel region. While there are more such threads than
CPUs, it "throttles": a worker waiting for the next region spins ~100 times and then
sleeps in the kernel, so every region pays a wake-up. The server steps the engine on a
thread of its own after the model was loaded (with torch ops, on the main thread): two
pools on two cores, and a batch-1 decode step of the default model took 12-13 ms instead
of 4, every GGUF matrix product ~130 us instead of ~40 (measured on an AMD EPYC, 2
cores). `release_openmp_pool()` frees the calling thread's pool (OpenMP 5's
omp_pause_resource_all, soft), so that the engine thread's pool is the only one.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("stepserve.model")
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t
_LIBGOMP = "libgomp.so.1"


def release_openmp_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (they come back if it starts
    another parallel region). False where the process has no libgomp loaded (torch built
    with another OpenMP, or none), or the runtime predates OpenMP 5."""
    try:  # only the copy already loaded (torch's): never load one for this
        gomp = ctypes.CDLL(_LIBGOMP, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        pause = gomp.omp_pause_resource_all
    except (OSError, AttributeError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    ok = pause(OMP_PAUSE_SOFT) == 0
    if not ok:
        log.debug("omp_pause_resource_all refused: OpenMP workers of this thread kept")
    return ok
