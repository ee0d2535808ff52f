"""The incident scenarios, each run once per test session as `stepserve simulate` runs
it (sim/run.py's run_scenario), for the tests that read their figures.

They run without the suite's per-step integrity check (tests/conftest.py): these runs
are about the figures, the blocks are checked by tests/core and test_decode_run, and
with the check on the four runs take twice their ~1 minute of CPU."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from stepserve.core.base import CHECK_INTEGRITY_ENV
from stepserve.sim.run import SimulateResult, run_scenario
from stepserve.sim.scenarios import get_scenario


def run(name: str, only: Sequence[str] | None = None) -> SimulateResult:
    saved = os.environ.pop(CHECK_INTEGRITY_ENV, None)
    try:
        return run_scenario(get_scenario(name), only=only)
    finally:
        if saved is not None:
            os.environ[CHECK_INTEGRITY_ENV] = saved


@pytest.fixture(scope="session")
def night_report() -> SimulateResult:
    # All 6,400 requests (100 rounds): the drain at the end, where continuous batching
    # runs out of work, must stay small against the rounds. The dynamic run is left out:
    # closed-loop, it forms the very batches static batching does (test_sim_scenarios).
    return run("night-report", ("static", "continuous"))


@pytest.fixture(scope="session")
def mixed_pool() -> SimulateResult:
    return run("mixed-pool")


@pytest.fixture(scope="session")
def promo_spike() -> SimulateResult:
    return run("promo-spike")


@pytest.fixture(scope="session")
def quickstart() -> SimulateResult:
    return run("quickstart")
