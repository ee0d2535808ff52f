"""Planning arithmetic: static-vs-continuous speedup cap, KV capacity, model shapes.

Standard library only; `job` prints it for `stepserve plan` (cli/plan.py).
"""
