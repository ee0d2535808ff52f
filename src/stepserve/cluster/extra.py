"""Whether the `cluster` extra (Ray Serve) is installed; the one line a user sees if not."""

from __future__ import annotations

import importlib

from stepserve.config.errors import UsageError

INSTALL = "pip install -e '.[cluster]'"


def require_ray_serve(what: str) -> None:
    """Raise UsageError naming the install command when Ray Serve cannot be imported."""
    try:
        importlib.import_module("ray.serve")
    except ImportError as e:
        raise UsageError(f"{what} runs its replicas on Ray Serve, which is not installed "
                         f"({e.name or e}): {INSTALL}") from None
