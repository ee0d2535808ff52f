"""Suite-wide settings: the engine core checks its KV blocks and queues after every step
(the debug switch), in this process and in every server it starts.

The suite runs on two workers (`-n 2 --dist loadgroup`, then the `serial` tests alone):
a file's tests stay on one worker (its module fixtures, a server process, start once),
and every Ray test on the same one (one local Ray cluster, not two)."""

from __future__ import annotations

import os

import pytest

from stepserve.core.base import CHECK_INTEGRITY_ENV

os.environ[CHECK_INTEGRITY_ENV] = "1"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = "ray" if item.path.parent.name == "cluster" else \
            str(item.path.relative_to(config.rootpath))
        item.add_marker(pytest.mark.xdist_group(group))
