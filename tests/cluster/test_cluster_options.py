"""`serve --replicas N` hands the ingress the same connection limits and shutdown setting
as the single-process server takes (no Ray started: the options are what is checked)."""

from __future__ import annotations

import stepserve.cluster.job as cluster_job
from stepserve.cli import main
from stepserve.server.connection_limits import ConnectionLimits


def test_connection_flags_reach_the_cluster_ingress(monkeypatch):
    seen = []
    monkeypatch.setattr(cluster_job, "run_cluster_serve", lambda o: seen.append(o) or 0)
    rc = main(["serve", "--model", "tiny", "--replicas", "2", "--port", "0",
               "--max-connections", "300", "--header-timeout", "3",
               "--shutdown-timeout", "7"])
    assert rc == 0
    (options,) = seen
    assert options.shutdown_timeout_s == 7
    assert isinstance(options.connection_limits, ConnectionLimits)
    assert options.connection_limits.max_connections == 300
    assert options.connection_limits.header_timeout_s == 3
