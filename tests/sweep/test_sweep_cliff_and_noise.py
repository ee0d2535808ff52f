"""The knee sits before the P99 cliff, not after it; a flat throughput is judged with a
noise margin, against every later point."""

from stepserve.metrics.run_summary import RunSummary
from stepserve.sweep.knee import analyze_series, find_cliff, find_flat, find_knee, steps_between
from stepserve.sweep.spec import parse_summary_slo

RATES = [6, 12, 24, 48, 96]


def _summaries(throughput, ttft):
    return [RunSummary(throughput_tokens_per_s=t, ttft_p99_s=p) for t, p in zip(throughput,
                                                                                 ttft)]


def test_a_cliff_while_throughput_still_gains_puts_the_knee_before_it():
    # config A of the quick start: TTFT P99 0.24 s -> 13 s at rate 24 while throughput
    # still gains 23%; throughput only flattens at 48. The knee is 12, not 48.
    result = analyze_series("A", RATES, _summaries([1161, 2139, 2633, 2643, 2643],
                                                   [0.18, 0.24, 13.01, 24.89, 30.96]),
                            [parse_summary_slo("ttft_p99_s=2")], x_axis="rate")
    assert (result.knee_index, result.knee_x) == (1, 12)
    assert (result.cliff_index, result.saturated_index) == (2, 3)
    assert result.recommended_index == 1 and result.best_slo_index == 1
    assert "jumps +5321% at x=24, throughput flat from x=48" in result.reason


def test_the_cliff_is_the_steepest_step_of_the_climb_into_saturation():
    # P99 rises +111%, +1570%, +75% into a flat throughput: the cliff is the +1570% step
    throughput, ttft = [1161, 2138, 3264, 3512, 3510], [0.17, 0.24, 0.50, 8.34, 14.59]
    steps = steps_between(throughput, ttft)
    cliff = find_cliff(steps, find_knee(throughput, ttft), 0.5)
    assert cliff.index == 3
    result = analyze_series("B", RATES, _summaries(throughput, ttft), x_axis="rate")
    assert result.knee_x == 24 and result.recommended_index == 2
    # a calm step (+4%) ends the climb: the +2,841% jump before it is not its cliff
    calm = [0.17, 5.0, 5.2, 8.0, 14.0]  # then +54%, +75% into saturation at 96
    result = analyze_series("B", RATES, _summaries(throughput, calm))
    assert (result.cliff_index, result.knee_x) == (4, 48)


def test_a_dip_and_its_recovery_are_noise_not_a_gain():
    # 2048 dips 9% (its tail a hair lower), 4096 recovers +10.7%: nothing beat 1024
    xs = [1024, 2048, 4096, 8192]
    throughput, ttft = [3250, 2950, 3266, 3260], [1.0, 0.99, 1.0, 1.0]
    result = analyze_series("A", xs, _summaries(throughput, ttft),
                            x_axis="max_num_batched_tokens")
    assert result.knee_index is None and result.flat_index == 1
    assert result.recommended_index == 0
    assert "5% noise margin" in result.reason
    # without a margin every difference counts, and the recovery looks like a gain
    assert find_flat(throughput, ttft, noise_margin=0.0) == 3


def test_a_real_gain_after_a_flat_step_is_not_cut_off():
    # +2% then +47%: throughput had not stopped rising at the second point
    throughput, ttft = [100, 102, 150], [1.0, 1.0, 1.0]
    assert find_flat(throughput, ttft) is None
    result = analyze_series("A", [1, 2, 3], _summaries(throughput, ttft), x_axis="max_num_seqs")
    assert result.recommended_index == 2


def test_a_much_lower_tail_is_a_gain_however_flat_the_throughput():
    # max_num_seqs 128 -> 256: +3.7% throughput but TTFT P99 3.28 s -> 0.47 s
    throughput, ttft = [1850, 2633, 3175, 3293], [33.3, 13.0, 3.28, 0.47]
    assert find_flat(throughput, ttft) is None
    result = analyze_series("A", [32, 64, 128, 256], _summaries(throughput, ttft),
                            x_axis="max_num_seqs")
    assert result.recommended_index == 3
