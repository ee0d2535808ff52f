"""`stepserve profile`: the real engine's step times fitted to the simulator's cost model
(job.py): a service over both, so neither imports the other."""
