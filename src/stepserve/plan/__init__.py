"""Planning arithmetic: static-vs-continuous speedup cap, KV capacity, model shapes.

Standard library only; `job` prints it for `stepserve plan` (cli/plan.py).
"""

from stepserve.plan.capacity import CapacityResult, capacity
from stepserve.plan.model_specs import MODEL_SPECS, ModelSpec, get_model_spec, list_model_specs
from stepserve.plan.sizes import format_size, parse_size
from stepserve.plan.speedup import (
    BatchStats,
    SpeedupResult,
    parse_group,
    speedup,
    speedup_for_lengths,
)

__all__ = [
    "MODEL_SPECS",
    "BatchStats",
    "CapacityResult",
    "ModelSpec",
    "SpeedupResult",
    "capacity",
    "format_size",
    "get_model_spec",
    "list_model_specs",
    "parse_group",
    "parse_size",
    "speedup",
    "speedup_for_lengths",
]
