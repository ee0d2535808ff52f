"""`doctor --url` on a cluster ingress: every series carries its replica's `pool`, and
the rules run on the whole server and on each pool, so a finding names the pool it is
in (a queue climbing in `offline` while `online` stays healthy)."""

from __future__ import annotations

import re

from metrics.canned_texts import rising_vllm_texts, vllm_text, window

from stepserve.metrics.doctor import live_runs
from stepserve.metrics.live_window import pool_windows


def _labelled(text: str, pool: str, engine: int) -> str:
    text = re.sub(r',?engine="\d+"', "", text).replace("{,", "{")
    return text.replace("{", f'{{pool="{pool}",engine="{engine}",')


def cluster_window():
    healthy = vllm_text(waiting=0, preempted=0, fast=10, slow=0, stop=10)
    return window(*(_labelled(rising, "offline", 1) + _labelled(healthy, "online", 0)
                    for rising in rising_vllm_texts()))


def test_each_pool_gets_its_own_findings():
    snapshots = cluster_window()
    assert set(pool_windows(snapshots)) == {"offline", "online"}
    results = {run.name: {f.rule for f in found}
               for run, found in live_runs("http://ingress", snapshots)}
    assert set(results) == {"http://ingress", "http://ingress pool offline",
                            "http://ingress pool online"}
    assert "queue_growing" in results["http://ingress pool offline"]
    assert "queue_growing" not in results["http://ingress pool online"]
    assert not results["http://ingress pool online"] & {"capacity", "preemption_nonzero"}


def test_a_server_without_pools_is_one_run():
    from metrics.canned_texts import rising_vllm_window

    assert pool_windows(rising_vllm_window()) == {}
    assert len(live_runs("http://one", rising_vllm_window())) == 1
