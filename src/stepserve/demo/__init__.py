"""`stepserve demo`: the main job (job.py)."""
