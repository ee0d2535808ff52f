"""The cluster tests' local Ray takes the loopback as its node address: this must be set
before anything imports ray (local_ray.prefer_loopback explains it)."""

from __future__ import annotations

import os

from stepserve.cluster.local_ray import LOOPBACK_ENV

os.environ.setdefault(LOOPBACK_ENV, "0")
