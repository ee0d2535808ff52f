"""The cluster tests' local Ray takes the loopback as its node address: this must be set
before anything imports ray (local_ray.prefer_loopback explains it). `ray_local`: one
local Ray (2 CPUs, loopback only, no dashboard) for every module that asks for it."""

from __future__ import annotations

import os

import pytest

from stepserve.cluster.local_ray import LOOPBACK_ENV

os.environ.setdefault(LOOPBACK_ENV, "0")


@pytest.fixture(scope="session")
def ray_local():
    from stepserve.cluster.local_ray import prefer_loopback, start_ray

    prefer_loopback()
    import ray

    start_ray(None, num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()
