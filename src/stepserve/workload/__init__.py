"""Workloads: who sends what, and when. A `Workload` (request classes x arrival process x
count x seed) generates a list of `RequestSpec`s, the same list for the same seed; standard
library only besides pyyaml."""

from stepserve.workload.arrivals import (
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    TraceReplay,
    parse_arrival,
)
from stepserve.workload.builtin import get_workload, list_workloads
from stepserve.workload.errors import WorkloadError
from stepserve.workload.lengths import (
    Empirical,
    Fixed,
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
from stepserve.workload.spec import RequestClass, RequestSpec, Workload
from stepserve.workload.trace import load_trace, save_trace

__all__ = [
    "ClosedLoop", "Constant", "Gamma", "Poisson", "TraceReplay", "parse_arrival",
    "WorkloadError", "Empirical", "Fixed", "LogNormal", "Mixture", "Uniform",
    "empirical", "fixed", "lognormal", "mixture", "parse_length", "uniform",
    "load_workload", "save_workload", "workload_from_dict", "workload_to_dict",
    "get_workload", "list_workloads", "RequestClass", "RequestSpec", "Workload",
    "load_trace", "save_trace",
]
