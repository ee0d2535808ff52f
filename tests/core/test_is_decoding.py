"""Request.is_decoding: the one definition of "this request is decoding"."""

from factories import make_requests, make_scheduler, step


def test_decoding_exactly_when_only_the_newest_sampled_token_is_missing():
    (r,) = make_requests(1, prompt_len=4)
    assert not r.is_decoding  # a fresh prompt
    r.num_computed_tokens = 3
    assert not r.is_decoding  # one prompt token left, nothing sampled yet: still prefill
    r.num_computed_tokens = 4
    r.output_token_ids.append(7)
    assert r.is_decoding  # prompt computed, the sampled token is missing
    r.num_computed_tokens = 0
    assert not r.is_decoding  # recompute after preemption: prompt and output again
    r.num_computed_tokens = 3
    assert not r.is_decoding  # a recompute chunk stopped short
    r.num_computed_tokens = 4
    assert r.is_decoding  # a recompute that caught up decodes again


def test_the_scheduler_gives_a_decoding_request_one_token():
    sched = make_scheduler()
    reqs = make_requests(3, prompt_len=6, max_tokens=4)
    for r in reqs:
        sched.add_request(r)
    first = step(sched)
    assert first.num_prefill_tokens == 18 and all(r.is_decoding for r in reqs)
    second = sched.schedule()
    assert second.num_scheduled_tokens == [1, 1, 1] and second.num_decode_tokens == 3
    assert second.num_decode_ready == 3
