"""Routing over engine replicas, as plain Python over a replica view: the same routers
and pool rules decide for the simulator's replicas (sim/loop.py) and for a Ray Serve
cluster's (cluster/). No torch, no Ray here."""
