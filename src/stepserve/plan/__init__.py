"""Planning arithmetic: static-vs-continuous speedup cap, KV capacity, model shapes.

No model and no simulation; `job` prints it for `stepserve plan` (cli/plan.py).
"""
