"""Freeing the calling thread's OpenMP workers, so the engine thread's pool is the only one:
libgomp keeps a pool per thread that ran a parallel region and throttles with more pools
than CPUs (two pools on 2 cores: batch-1 decode 12-13 ms instead of 4).
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
