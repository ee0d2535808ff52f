"""Moved to engine/drive.py (kept until the demo imports it from there)."""

from stepserve.engine.drive import ClosedLoopResult, run_closed_loop

__all__ = ["ClosedLoopResult", "run_closed_loop"]
