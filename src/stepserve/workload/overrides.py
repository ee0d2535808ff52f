"""Overriding a workload's count, seed, rate, concurrency, arrival process or duration, the
one way every command and scenario does it. `arrival` replaces the process first (bench's
--request-rate, --burstiness, --max-concurrency); then `rate` applies to poisson, gamma
(keeping its burstiness) and constant arrivals, `concurrency` to a closed loop or a trace
replayed closed-loop, and any other pairing is a WorkloadError.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stepserve.workload.arrivals import ArrivalProcess, RatedArrival
from stepserve.workload.errors import WorkloadError
from stepserve.workload.spec import Workload


@dataclass(frozen=True)
class WorkloadOverrides:
    """Values to put in place of a workload's own; None: keep the workload's."""

    num_requests: int | None = None
    seed: int | None = None
    rate: float | None = None
    concurrency: int | None = None
    arrival: ArrivalProcess | None = None
    duration_s: float | None = None

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    def merged(self, later: WorkloadOverrides) -> WorkloadOverrides:
        """These overrides with `later`'s given values on top."""
        return dataclasses.replace(self, **later.given())


def override_workload(workload: Workload, overrides: WorkloadOverrides) -> Workload:
    """`workload` with `overrides` applied (see the module doc); WorkloadError, naming the
    workload and its arrivals, for a rate or concurrency its arrivals do not have."""
    changes = overrides.given()
    if not changes:
        return workload
    arrival = changes.pop("arrival", workload.arrival)
    rate = changes.pop("rate", None)
    concurrency = changes.pop("concurrency", None)
    if rate is not None:
        if not isinstance(arrival, RatedArrival):
            raise WorkloadError(
                f"rate = {rate:g}: workload {workload.name} has {arrival.describe()}, which "
                "has no rate; a rate applies to poisson, gamma and constant arrivals")
        arrival = dataclasses.replace(arrival, rate_per_s=float(rate))
    if concurrency is not None:
        if arrival.closed_loop_concurrency is None:
            raise WorkloadError(
                f"concurrency = {concurrency}: workload {workload.name} has "
                f"{arrival.describe()} (open loop); concurrency applies to closed_loop "
                "arrivals and a trace replayed closed-loop")
        arrival = dataclasses.replace(arrival, concurrency=int(concurrency))
    if arrival is not workload.arrival:
        changes["arrival"] = arrival
    return dataclasses.replace(workload, **changes)
