"""The ingress's /metrics: every replica's families once each (HELP and TYPE once, then
every replica's samples), each sample labelled with its engine and pool; and the view a
router gets of a replica from its report and the ingress's own count."""

from __future__ import annotations

from stepserve.cluster.messages import ReplicaStats
from stepserve.cluster.metrics_merge import merge_metrics, with_labels
from stepserve.metrics.prometheus import parse_prometheus

REPLICA = """# HELP stepserve:num_requests_running requests in the running batch
# TYPE stepserve:num_requests_running gauge
stepserve:num_requests_running{model_name="tiny"} 3.0
# HELP stepserve:request_success_total requests ended
# TYPE stepserve:request_success_total counter
stepserve:request_success_total{finished_reason="stop",model_name="tiny"} 5.0
# HELP stepserve:steps_total steps
# TYPE stepserve:steps_total counter
stepserve:steps_total 7.0
"""


def test_each_family_once_and_every_sample_labelled():
    text = merge_metrics([(0, "online", REPLICA), (2, "offline", REPLICA)])
    assert text.count("# TYPE stepserve:num_requests_running gauge") == 1
    lines = text.splitlines()
    head = lines.index("# TYPE stepserve:num_requests_running gauge")
    assert lines[head + 1:head + 3] == [
        'stepserve:num_requests_running{engine="0",pool="online",model_name="tiny"} 3.0',
        'stepserve:num_requests_running{engine="2",pool="offline",model_name="tiny"} 3.0']
    assert 'stepserve:steps_total{engine="2",pool="offline"} 7.0' in lines


def test_the_merged_text_is_valid_prometheus_text():
    from prometheus_client.parser import text_string_to_metric_families

    text = merge_metrics([(0, "a", REPLICA), (1, "b", REPLICA)])
    families = {f.name: f for f in text_string_to_metric_families(text)}  # strict
    running = families["stepserve:num_requests_running"].samples
    assert {(s.labels["engine"], s.labels["pool"]) for s in running} == {("0", "a"),
                                                                          ("1", "b")}
    assert parse_prometheus(text)[("stepserve:steps_total",
                                   frozenset({("engine", "1"), ("pool", "b")}))] == 7.0


def test_labels_go_first_and_values_stay():
    assert with_labels('x{a="1"} 2', 'engine="0"') == 'x{engine="0",a="1"} 2'
    assert with_labels("x 2", 'engine="0"') == 'x{engine="0"} 2'


def test_a_replica_view_counts_what_the_ingress_has_in_flight():
    stats = ReplicaStats(engine=3, pool="online", pid=1, waiting=0, running=2,
                         kv_usage=0.5)
    assert ReplicaStats.from_dict(stats.to_dict()) == stats
    assert ReplicaStats.from_dict({}) is None
    view = stats.view(outstanding=5)  # three sent since the last report
    assert (view.index, view.pool, view.outstanding, view.running) == (3, "online", 5, 2)
    assert stats.view(outstanding=1).outstanding == 1  # ended since the report


def test_a_replica_s_own_engine_label_gives_way_to_the_merge_s():
    assert with_labels('x{model_name="m",engine="0"} 1', 'engine="2",pool="p"') == \
        'x{engine="2",pool="p",model_name="m"} 1'
    assert with_labels('x{engine="0"} 1', 'engine="2"') == 'x{engine="2"} 1'
