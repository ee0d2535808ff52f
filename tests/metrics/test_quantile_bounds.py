"""Quantiles known only to lie in a wide bucket: which are wide, and how the rules read
them (a tail at its lower bound, a median at its upper), so that no alert rests on where
interpolation put a value inside its bucket."""

import math

import pytest

from stepserve.metrics import rules
from stepserve.metrics.prometheus import BucketQuantile
from stepserve.metrics.quantile_bounds import (
    bounds_entry,
    bounds_notes,
    is_wide,
    read_bounds,
    verdict_summary,
)
from stepserve.metrics.rules import unevaluable
from stepserve.metrics.run_summary import RunSummary


@pytest.mark.parametrize("lower, upper, wide", [
    (5.0, 7.5, False), (0.5, 0.75, False), (20.0, 40.0, True), (0.0, 0.001, True),
    (80.0, math.inf, True), (7.5, 10.0, False), (10.0, 15.01, True)])
def test_a_bucket_over_one_and_a_half_times_its_lower_bound_is_wide(lower, upper, wide):
    assert is_wide(BucketQuantile(lower, lower, upper)) is wide


def test_the_top_bucket_keeps_no_upper_bound():
    assert bounds_entry(BucketQuantile(80.0, 80.0, math.inf)) == {"lower": 80.0, "upper": None}


# TPOT P99/P50 = 0.3 / 0.05 = 6: over tpot_tail's 5x, if the interpolation is right
TAIL = dict(tpot_p99_s=0.3, tpot_p50_s=0.05, p99_p50_tpot_ratio=6.0, tpot_mean_s=0.055)


def test_a_tail_alert_that_rests_on_the_interpolation_stays_silent():
    assert rules.tpot_tail(RunSummary(**TAIL)) is not None
    # the P99 lies somewhere in 0.2-0.4 s: at 0.2 s the ratio is 4, under the line
    wide_p99 = RunSummary(**TAIL, quantile_bounds={"tpot_p99_s": {"lower": 0.2, "upper": 0.4}})
    assert rules.tpot_tail(wide_p99) is None
    # the P50 lies in 0.025-0.05 s: at its upper bound, 0.05 s, the ratio stays 6
    wide_p50 = RunSummary(**TAIL,
                          quantile_bounds={"tpot_p50_s": {"lower": 0.025, "upper": 0.05}})
    f = rules.tpot_tail(wide_p50)
    assert f is not None and "TPOT P99/P50 = 6.0" in f.evidence


def test_a_ratio_is_worked_out_again_from_its_bounds():
    s = RunSummary(preemptions=5, ttft_p99_s=36.0, ttft_p50_s=3.0, p99_p50_ttft_ratio=12.0)
    assert rules.capacity(s) is not None
    bounded = RunSummary(preemptions=5, ttft_p99_s=36.0, ttft_p50_s=3.0,
                         p99_p50_ttft_ratio=12.0,
                         quantile_bounds={"ttft_p99_s": {"lower": 20.0, "upper": 40.0}})
    assert verdict_summary(bounded).p99_p50_ttft_ratio == pytest.approx(20 / 3)
    assert rules.capacity(bounded) is None  # 6.7 is no capacity tail
    # both in one bucket: the P99 is at least the P50, so the ratio at least 1
    same = RunSummary(ttft_p99_s=39.6, ttft_p50_s=22.2, p99_p50_ttft_ratio=1.78,
                      quantile_bounds={"ttft_p99_s": {"lower": 20.0, "upper": 40.0},
                                       "ttft_p50_s": {"lower": 20.0, "upper": 40.0}})
    assert verdict_summary(same).p99_p50_ttft_ratio == 1.0


def test_a_median_past_the_top_bucket_is_unknown():
    s = RunSummary(**TAIL, quantile_bounds={"tpot_p50_s": {"lower": 0.08, "upper": None}})
    assert verdict_summary(s).tpot_p50_s is None
    assert unevaluable(s)["tpot_tail"] == ["tpot_p50_s or p99_p50_tpot_ratio"]
    assert rules.tpot_tail(s) is None


def test_only_what_a_rule_compares_is_read_at_a_bound():
    s = RunSummary(ttft_p50_s=22.2, tpot_p50_s=0.043,
                   quantile_bounds={"ttft_p50_s": {"lower": 20.0, "upper": 40.0},
                                    "tpot_p50_s": {"lower": 0.025, "upper": 0.05}})
    read = verdict_summary(s, {"tpot_p50_s"})
    assert read.tpot_p50_s == 0.05 and read.ttft_p50_s == 22.2  # quoted, not compared
    assert verdict_summary(s).ttft_p50_s == 40.0


@pytest.mark.parametrize("held", [
    "x", [1, 2], {"ttft_p99_s": "x"}, {"nope_p99_s": {"lower": 1.0, "upper": 2.0}},
    {"waiting_max": {"lower": 1.0, "upper": 2.0}}, {"ttft_p99_s": {"lower": -1.0}},
    {"ttft_p99_s": {"lower": 4.0, "upper": 2.0}}, {"ttft_p99_s": {"lower": math.nan}},
    {"ttft_p99_s": {"lower": True, "upper": 2.0}}, {"ttft_p99_s": {"upper": 2.0}},
    {"ttft_p99_s": {"lower": 1.0, "upper": "2"}}])
def test_bounds_a_file_cannot_mean_are_left_out(held):
    s = RunSummary(ttft_p99_s=1.5, quantile_bounds=held)
    assert read_bounds(s) == [] and verdict_summary(s) is s
    assert bounds_notes(s) == ([], {})


def test_the_report_line_and_json_say_the_bounds_and_what_the_rules_read():
    s = RunSummary(ttft_p99_s=78.0, e2e_p50_s=640.0,
                   quantile_bounds={"ttft_p99_s": {"lower": 40.0, "upper": 80.0},
                                    "e2e_p50_s": {"lower": 640.0, "upper": None}})
    (line,), shown = bounds_notes(s)
    assert "TTFT P99 in 40-80 s (interpolated 78 s)" in line
    assert "E2E P50 above 640 s, past the top bucket (interpolated 640 s)" in line
    assert shown["ttft_p99_s"] == {"lower": 40.0, "upper": 80.0, "interpolated": 78.0,
                                   "rules_read": 40.0}
    assert shown["e2e_p50_s"]["rules_read"] is None
