"""Prometheus text, per-server names, counter increases and histogram quantiles on
hand-built inputs."""

import math

import pytest

from stepserve.metrics.prometheus import (
    SOURCES,
    BucketQuantile,
    Histogram,
    Snapshot,
    bucket_quantile,
    bucket_quantile_in,
    counter_delta,
    counter_delta_by_reason,
    detect_source,
    histogram_delta,
    parse_prometheus,
)

INF = math.inf


def snap(text: str, t: float = 0.0) -> Snapshot:
    return Snapshot(t, parse_prometheus(text))


def test_parse_labels_comments_and_bad_lines():
    s = parse_prometheus('# HELP x y\nx{a="1",b="two"} 3.5\ny 2\nbroken\nz{a="1"} nan?\n')
    assert s[("x", frozenset({("a", "1"), ("b", "two")}))] == 3.5
    assert s[("y", frozenset())] == 2.0
    assert len(s) == 2


def test_non_finite_values_are_missing_and_named():
    text = ('a 1\nb NaN\nc +Inf\nd -Inf\n'
            'h_bucket{le="1"} NaN\nh_bucket{le="+Inf"} 4\nh_count 4\nh_sum 2\n')
    names: set[str] = set()
    s = parse_prometheus(text, names)
    assert set(s) == {("a", frozenset()), ("h_bucket", frozenset({("le", "+Inf")})),
                      ("h_count", frozenset()), ("h_sum", frozenset())}
    assert names == {"b", "c", "d", "h_bucket"}
    assert parse_prometheus(text) == s  # the names are only collected where asked


def test_label_values_with_commas_escaped_quotes_and_newlines_survive():
    text = ('# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{model_name="org/m,v2 \\"chat\\"\\n",engine="0"} 3\n'
            'vllm:num_requests_waiting{model_name="a,b",engine="1"} 4\n')
    s = parse_prometheus(text)
    assert s[("vllm:num_requests_waiting",
              frozenset({("model_name", 'org/m,v2 "chat"\n'), ("engine", "0")}))] == 3.0
    assert s[("vllm:num_requests_waiting",
              frozenset({("model_name", "a,b"), ("engine", "1")}))] == 4.0
    assert Snapshot(0.0, s).level("waiting") == 7.0  # summed over both engines


# ---- bucket_quantile: Prometheus' histogram_quantile on hand-built buckets ----

BUCKETS = [(0.1, 2.0), (0.5, 6.0), (1.0, 10.0), (INF, 10.0)]  # cumulative


@pytest.mark.parametrize("q, want", [
    (0.5, 0.1 + 0.4 * (5 - 2) / 4),  # rank 5 lies in (0.1, 0.5], 3 of its 4
    (0.1, 0.1 * 1 / 2),  # rank 1 in the first bucket: from 0
    (0.2, 0.1),  # exactly at a bucket's top
    (1.0, 1.0),
])
def test_quantile_interpolates_inside_the_bucket(q, want):
    assert bucket_quantile(q, BUCKETS) == pytest.approx(want)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    assert bucket_quantile(0.99, [(0.1, 1.0), (0.5, 2.0), (INF, 10.0)]) == 0.5


def test_quantile_order_and_dips_do_not_matter():
    shuffled = [BUCKETS[2], BUCKETS[0], BUCKETS[3], BUCKETS[1]]
    assert bucket_quantile(0.5, shuffled) == bucket_quantile(0.5, BUCKETS)
    # a count that dips below its predecessor is raised to it, as Prometheus does: the
    # counts read 2, 2, 4, 4, so rank 2 of 4 is the first bucket's top
    assert bucket_quantile(0.5, [(0.1, 2.0), (0.5, 1.0), (1.0, 4.0), (INF, 4.0)]) == \
        pytest.approx(0.1)


@pytest.mark.parametrize("buckets", [
    [], [(INF, 3.0)], [(0.1, 1.0), (0.5, 2.0)],  # too few, or no +Inf
    [(0.1, 0.0), (INF, 0.0)],  # no observations
])
def test_quantile_none_without_usable_buckets(buckets):
    assert bucket_quantile(0.5, buckets) is None


def test_quantile_rejects_q_outside_0_1():
    with pytest.raises(ValueError, match="0..1"):
        bucket_quantile(1.5, BUCKETS)


def test_a_quantile_knows_the_bucket_it_lies_in():
    # rank 5 of 10 in (0.1, 0.5] (2 below, 4 in it); rank 1 in the first bucket, from 0
    assert bucket_quantile_in(0.5, BUCKETS) == BucketQuantile(0.1 + 0.4 * 3 / 4, 0.1, 0.5)
    assert bucket_quantile_in(0.1, BUCKETS) == BucketQuantile(0.05, 0.0, 0.1)
    # past the last finite bound: Prometheus answers that bound; the bucket is unbounded
    over = [(0.1, 1.0), (0.5, 2.0), (INF, 10.0)]
    assert bucket_quantile_in(0.99, over) == BucketQuantile(0.5, 0.5, INF)
    assert bucket_quantile_in(0.5, [(0.1, 0.0), (INF, 0.0)]) is None


def test_histogram_delta_is_what_the_window_observed():
    before = Histogram(((0.1, 1.0), (1.0, 2.0), (INF, 2.0)), 0.6, 2.0)
    after = Histogram(((0.1, 1.0), (1.0, 6.0), (INF, 7.0)), 9.6, 7.0)
    d = after.minus(before)
    assert d.buckets == ((0.1, 0.0), (1.0, 4.0), (INF, 5.0)) and d.count == 5.0
    assert d.mean == pytest.approx(9.0 / 5)
    assert d.quantile(0.5) == pytest.approx(0.1 + 0.9 * 2.5 / 4)


# ---- sources and names ----

@pytest.mark.parametrize("line, name", [
    ("stepserve:num_requests_waiting 1", "stepserve"),
    ("vllm:num_requests_waiting 1", "vllm"),
    ("sglang:num_queue_reqs 1", "sglang"),
    ("tgi_queue_size 1", "tgi"),
    ("process_cpu_seconds_total 1", None),
])
def test_detect_source(line, name):
    src = detect_source(parse_prometheus(line))
    assert (src.name if src else None) == name


def test_ours_wins_over_vllm_names_in_the_same_text():
    assert detect_source(parse_prometheus("vllm:x 1\nstepserve:y 1")).name == "stepserve"


def test_every_source_maps_the_queue_and_the_batch():
    for src in SOURCES:
        assert {"waiting", "running"} <= set(src.levels), src.name


def test_levels_sum_label_sets_and_take_the_first_name_present():
    s = snap('vllm:num_requests_waiting{engine="0"} 3\nvllm:num_requests_waiting{engine="1"} 4\n'
             'vllm:gpu_cache_usage_perc 0.5\n')
    assert s.level("waiting") == 7.0
    assert s.level("kv_usage") == 0.5  # the deprecated name still reads
    assert s.level("running") is None


def test_counters_with_or_without_total_and_only_completed_requests():
    s = snap('vllm:num_preemptions_total 2\ntgi_request_success 9\n'
             'vllm:request_success_total{finished_reason="stop"} 4\n'
             'vllm:request_success_total{finished_reason="length"} 1\n'
             'vllm:request_success_total{finished_reason="abort"} 5\n')
    assert s.counter("preemptions") == 2.0
    assert s.counter("requests_finished") == 5.0  # abort left out
    assert snap("tgi_request_success 9").counter("requests_finished") == 9.0  # no _total


def test_counter_delta_and_a_restart():
    a, b = snap("sglang:prompt_tokens_total 100"), snap("sglang:prompt_tokens_total 160")
    assert counter_delta(a, b, "prompt_tokens") == 60.0
    assert counter_delta(b, snap("sglang:prompt_tokens_total 40"), "prompt_tokens") == 40.0
    assert counter_delta(a, b, "steps") is None  # SGLang counts no steps


def test_histogram_sums_label_sets_and_drops_a_restart():
    text = ('tgi_batch_inference_duration_bucket{method="prefill",le="0.1"} {p}\n'
            'tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} {p}\n'
            'tgi_batch_inference_duration_bucket{method="decode",le="0.1"} {d}\n'
            'tgi_batch_inference_duration_bucket{method="decode",le="+Inf"} {d}\n'
            'tgi_batch_inference_duration_sum{method="decode"} {s}\n'
            'tgi_batch_inference_duration_count{method="decode"} {d}\n')
    a = snap(text.replace("{p}", "1").replace("{d}", "2").replace("{s}", "0.1"))
    b = snap(text.replace("{p}", "3").replace("{d}", "8").replace("{s}", "0.4"))
    h = b.histogram("step_time")
    assert h.buckets == ((0.1, 11.0), (INF, 11.0))
    d = histogram_delta(a, b, "step_time")
    assert d.buckets == ((0.1, 8.0), (INF, 8.0)) and d.count == 6.0
    assert histogram_delta(b, a, "step_time") is None  # fell: a restart, nothing to read


def test_vllm_itl_and_tpot_are_read_apart():
    # each token's gap (ITL) and each request's mean (TPOT): never one for the other
    itl = ('vllm:inter_token_latency_seconds_bucket{le="0.1"} 9\n'
           'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 10\n')
    tpot = ('vllm:request_time_per_output_token_seconds_bucket{le="0.1"} 2\n'
            'vllm:request_time_per_output_token_seconds_bucket{le="+Inf"} 2\n')
    s = snap(itl + tpot)
    assert s.histogram("itl").buckets == ((0.1, 9.0), (INF, 10.0))
    assert s.histogram("tpot").buckets == ((0.1, 2.0), (INF, 2.0))
    assert snap(itl).histogram("tpot") is None
    # before inter_token_latency_seconds, vLLM's per-token histogram had the TPOT name
    old = snap(itl.replace("inter_token_latency", "time_per_output_token"))
    assert old.histogram("itl").buckets == ((0.1, 9.0), (INF, 10.0))
    assert old.histogram("tpot") is None


def test_series_by_reason_and_their_increase():
    text = ('vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_reqs"}} {a}\n'
            'vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_tokens"}} '
            '{b}\n'
            'vllm:num_requests_waiting_by_reason{{engine="0",reason="capacity"}} 3\n'
            'vllm:num_requests_waiting_by_reason{{engine="1",reason="capacity"}} 2\n'
            'vllm:num_requests_waiting_by_reason{{engine="0",reason="deferred"}} 1\n')
    a, b = snap(text.format(a=2, b=0)), snap(text.format(a=7, b=1))
    assert b.by_reason("waiting_by_reason") == {"capacity": 5.0, "deferred": 1.0}
    assert b.by_reason("rejected") == {"max_num_queued_reqs": 7.0, "max_num_queued_tokens": 1.0}
    assert b.counter("rejected") == 8.0
    assert counter_delta_by_reason(a, b, "rejected") == {"max_num_queued_reqs": 5.0,
                                                         "max_num_queued_tokens": 1.0}
    # a fall is a restart (the later value is the increase), a new reason counts from 0
    restarted = snap('vllm:admission_rejections_total{reason="max_num_queued_reqs"} 1\n'
                     'vllm:admission_rejections_total{reason="other"} 4\n')
    assert counter_delta_by_reason(b, restarted, "rejected") == {"max_num_queued_reqs": 1.0,
                                                                 "other": 4.0}
    assert counter_delta_by_reason(a, snap("vllm:num_requests_waiting 0"), "rejected") is None
    # ours are request_rejected{reason}; SGLang has neither series
    ours = snap('stepserve:request_rejected_total{reason="queue_full"} 3\n')
    assert ours.by_reason("rejected") == {"queue_full": 3.0}
    assert ours.by_reason("waiting_by_reason") is None
    # our reasons' children appear at their first count: none yet is none refused
    quiet = snap("stepserve:num_requests_waiting 0\n")
    assert quiet.by_reason("rejected") == {} and quiet.counter("rejected") == 0.0
    assert snap("vllm:num_requests_waiting 0").counter("rejected") is None
    assert snap("sglang:num_queue_reqs 1").by_reason("rejected") is None


def test_info_labels_of_our_config_gauge():
    s = snap('stepserve:scheduler_config_info{model_name="m",max_num_seqs="2"} 1\n')
    assert s.info() == {"max_num_seqs": "2"}
    assert snap("vllm:num_requests_waiting 0").info() is None
