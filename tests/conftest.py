"""Suite-wide settings: the engine core checks its KV blocks and queues after every step
(the debug switch), in this process and in every server it starts.

The suite runs on two workers (`-n 2 --dist loadgroup -m "not serial"`), then the
`serial` tests alone: those that time the server, the soak and every Ray test (with two
busy neighbours, Ray's drains, restarts and long streams outlasted their waits). A file's
tests stay on one worker (its module fixtures, a server process, start once)."""

from __future__ import annotations

import os

import pytest

from stepserve.core.base import CHECK_INTEGRITY_ENV

os.environ[CHECK_INTEGRITY_ENV] = "1"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        ray = item.path.parent.name == "cluster"
        group = "ray" if ray else str(item.path.relative_to(config.rootpath))
        item.add_marker(pytest.mark.xdist_group(group))
        if ray:  # replicas, drains and restarts waited on a machine shared with a worker
            item.add_marker(pytest.mark.serial)
