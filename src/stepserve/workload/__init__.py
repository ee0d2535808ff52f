"""Workloads: who sends what, and when.

A `Workload` (request classes x arrival process x count x seed) generates a list of
`RequestSpec`s, the same list for the same seed. Standard library only (`random`, `math`)
besides pyyaml; no numpy, no torch.
"""

from stepserve.workload.arrivals import (
    ArrivalProcess,
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    TraceReplay,
    parse_arrival,
    trace_replay,
)
from stepserve.workload.builtin import get_workload, list_workloads
from stepserve.workload.errors import WorkloadError
from stepserve.workload.lengths import (
    Empirical,
    Fixed,
    LengthDist,
    LogNormal,
    Mixture,
    Uniform,
    empirical,
    fixed,
    lognormal,
    mixture,
    parse_length,
    uniform,
)
from stepserve.workload.loader import (
    load_workload,
    save_workload,
    workload_from_dict,
    workload_to_dict,
)
from stepserve.workload.overrides import WorkloadOverrides, override_workload
from stepserve.workload.spec import LENGTH_ESTIMATES, RequestClass, RequestSpec, Workload
from stepserve.workload.trace import load_trace, save_trace

__all__ = [
    "ArrivalProcess", "ClosedLoop", "Constant", "Gamma", "Poisson", "TraceReplay",
    "parse_arrival", "trace_replay", "WorkloadError",
    "Empirical", "Fixed", "LengthDist", "LogNormal", "Mixture", "Uniform",
    "empirical", "fixed", "lognormal", "mixture", "parse_length", "uniform",
    "load_workload", "save_workload", "workload_from_dict", "workload_to_dict",
    "get_workload", "list_workloads", "WorkloadOverrides", "override_workload",
    "LENGTH_ESTIMATES", "RequestClass", "RequestSpec", "Workload",
    "load_trace", "save_trace",
]
