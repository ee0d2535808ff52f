"""The knee finder on hand-made series."""

import pytest

from stepserve.metrics.run_summary import RunSummary
from stepserve.sweep.knee import analyze_series, find_knee, is_ordered
from stepserve.sweep.spec import parse_summary_slo


def _analyze(*args, **kwargs):
    """analyze_series on the E2E P99 (the summaries below carry TTFT P99 for the SLO tests)."""
    return analyze_series(*args, p99_metric="e2e_p99_s", **kwargs)


def test_the_default_tail_metric_is_ttft_p99():
    summaries = [RunSummary(throughput_tokens_per_s=t, ttft_p99_s=p, e2e_p99_s=1.0)
                 for t, p in ((100, 0.1), (200, 0.2), (201, 2.0))]
    result = analyze_series("A", [1, 2, 3], summaries)
    assert (result.knee_index, result.cliff_index, result.saturated_index) == (1, 2, 2)


def _summaries(throughput, p99, ttft=None):
    ttft = ttft or [0.1] * len(throughput)
    return [RunSummary(throughput_tokens_per_s=t, e2e_p99_s=p, ttft_p99_s=f)
            for t, p, f in zip(throughput, p99, ttft)]


def test_the_knee_is_the_last_point_before_the_p99_cliff():
    # +100%, +50%, then +2% with P99 x3 (saturation), then +1% with P99 x2
    throughput = [1000, 2000, 3000, 3060, 3090]
    p99 = [1.0, 1.2, 1.5, 4.5, 9.0]
    saturated = find_knee(throughput, p99)
    assert saturated.index == 3
    assert saturated.throughput_gain == pytest.approx(0.02)
    assert saturated.p99_rise == pytest.approx(2.0)
    result = _analyze("A", [4, 8, 16, 32, 64], _summaries(throughput, p99))
    assert (result.knee_index, result.knee_x, result.cliff_index) == (2, 16, 3)
    assert result.recommended_index == 2  # the knee itself: its tail had not jumped
    assert result.reason.startswith("the knee: the last point before e2e_p99_s jumps")


def test_no_knee_when_throughput_keeps_rising_or_p99_stays_flat():
    # throughput still rising: P99 climbs but gains are > 5%
    assert find_knee([100, 200, 300, 400], [1, 2, 4, 8]) is None
    # throughput flat but P99 calm: saturated yet not queueing hard
    assert find_knee([100, 200, 201, 202], [1, 1.1, 1.2, 1.3]) is None
    result = _analyze("A", [1, 2, 3, 4], _summaries([100, 200, 300, 400], [1, 2, 4, 8]))
    assert result.knee_index is None and result.recommended_index == 3
    assert result.reason.startswith("no knee")


def test_flat_throughput_without_a_knee_stops_the_recommendation_before_it():
    # saturated from x=3 (+0.5%) while P99 rises only 10%: no knee, but more load buys nothing
    result = _analyze("A", [1, 2, 3, 4], _summaries([100, 200, 201, 202],
                                                          [1, 1.1, 1.21, 1.3]))
    assert result.knee_index is None and result.flat_index == 2
    assert result.recommended_index == 1
    assert "stopped rising at x=3" in result.reason
    # a flat step whose P99 falls is not saturation: the later point is better
    result = _analyze("A", [1, 2, 3], _summaries([100, 200, 201], [2, 2, 1]))
    assert result.flat_index is None and result.recommended_index == 2
    # with an SLO, the flat step still bounds the recommendation
    slo = parse_summary_slo("e2e_p99_s=1.05")
    result = _analyze("A", [1, 2, 3, 4], _summaries([100, 200, 201, 202],
                                                          [1, 1.1, 1.21, 1.3]), [slo])
    assert result.recommended_index == 0 and "meeting e2e_p99_s <= 1.05" in result.reason


def test_a_named_axis_gets_the_lowest_tail_among_the_top_throughputs():
    # policies: order means nothing, so no "flat" cut; fair is within 5% of the best
    # throughput and has the lowest tail, srpt misses the SLO
    xs = ["fcfs", "srpt", "fair", "priority"]
    summaries = _summaries([1000, 1050, 1010, 700], [2.0, 9.0, 1.5, 0.5])
    result = _analyze("A", xs, summaries, x_axis="policy")
    assert result.knee_index is None and result.flat_index is None
    assert xs[result.recommended_index] == "fair"  # priority: lowest tail, too slow
    assert "within 5% of the most throughput" in result.reason
    slo = parse_summary_slo("e2e_p99_s=1.8")
    result = _analyze("A", xs, summaries, [slo], x_axis="policy")
    assert xs[result.recommended_index] == "fair"
    strict = _analyze("A", xs, summaries, [parse_summary_slo("e2e_p99_s=1")], x_axis="policy")
    assert xs[strict.recommended_index] == "priority"  # the only one meeting it
    assert is_ordered([1, 2.5]) and not is_ordered(["a", "b"]) and not is_ordered([1, 2], "seed")
    assert not is_ordered([True, False])


def test_flat_wording_follows_the_axis():
    summaries = _summaries([100, 200, 201], [1, 1.1, 1.2])
    load = _analyze("A", [1, 2, 3], summaries, x_axis="rate")
    setting = _analyze("A", [16, 32, 64], summaries, x_axis="max_num_seqs")
    assert "buys queueing" in load.reason and "bought no throughput" in setting.reason
    assert load.recommended_index == setting.recommended_index == 1


def test_both_thresholds_are_settings():
    throughput, p99 = [100, 200, 206, 207], [1, 1.2, 1.5, 1.6]
    assert find_knee(throughput, p99) is None
    assert find_knee(throughput, p99, min_throughput_gain=0.05, max_p99_rise=0.2).index == 2
    assert find_knee(throughput, p99, min_throughput_gain=0.01, max_p99_rise=0.2) is None


def test_slo_limits_the_recommendation_before_the_knee():
    throughput = [1000, 2000, 3000, 3060, 3090]
    p99 = [1.0, 1.2, 1.5, 4.5, 9.0]
    ttft = [0.2, 0.8, 2.5, 9.0, 20.0]  # the SLO fails one point before the knee
    slo = parse_summary_slo("ttft_p99_s=2")
    result = _analyze("A", [4, 8, 16, 32, 64], _summaries(throughput, p99, ttft), [slo])
    assert result.knee_index == 2
    assert result.slo_met == [True, True, False, False, False]
    assert result.best_slo_index == 1
    assert result.recommended_index == 1
    assert "ttft_p99_s <= 2 before the knee (x=16" in result.reason


def test_no_point_meets_the_slo():
    result = _analyze("A", [1, 2], _summaries([1, 2], [1, 1], [5, 5]),
                            [parse_summary_slo("ttft_p99_s<=1")])
    assert result.recommended_index is None and result.best_slo_index is None
    assert "no point" in result.reason


def test_slo_lower_bounds_and_missing_values():
    at_least = parse_summary_slo("throughput_tokens_per_s>=1500")
    assert at_least.at_least and at_least.met_by(RunSummary(throughput_tokens_per_s=1500))
    assert not at_least.met_by(RunSummary(throughput_tokens_per_s=1499))
    assert not parse_summary_slo("ttft_p99_s=2").met_by(RunSummary(ttft_p99_s=None))
    with pytest.raises(ValueError, match="METRIC=LIMIT"):
        parse_summary_slo("ttft_p99_s")
    with pytest.raises(ValueError, match="'ttft_p99' is not a number of a run's summary"):
        parse_summary_slo("ttft_p99=2")  # a typo would never be met, silently


def test_undefined_values_never_make_a_knee():
    assert find_knee([0, 100, 100], [None, 1, 5]).index == 2
    assert find_knee([100, None, 100], [1, 5, 50]) is None
