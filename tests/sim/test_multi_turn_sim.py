"""Multi-turn sessions in the simulator: a later turn arrives its think time after the
turn before it ended, its prompt that turn's prompt and output plus a new user message,
so the prefix cache serves the conversation so far; a turn whose predecessor failed is
never sent, and a closed loop counts sessions, not turns."""

from __future__ import annotations

import pytest

from stepserve.config.settings import EngineConfig
from stepserve.metrics.summary import summarize
from stepserve.sim.cost import ConstantCost
from stepserve.sim.loop import simulate
from stepserve.workload.loader import workload_from_dict
from stepserve.workload.sessions import next_turns


def workload(turns: int, num: int = 12, think: float = 0.5, arrival=None, **cls):
    body = {"name": "c", "prompt": 64, "output": 24,
            "multi_turn": {"turns": turns, "think_time_s": think, "user_len": 20}, **cls}
    return workload_from_dict({"seed": 3, "num_requests": num,
                               "arrival": arrival or {"poisson": {"rate": 4.0}},
                               "classes": [body]})


def cfg(**kw):
    return EngineConfig().replace(**{"max_model_len": 2048, **kw})


def run(w, blocks=1024, decode_runs=True, **kw):
    specs = w.generate()
    sim = simulate(cfg(**kw), specs, ConstantCost(0.01), blocks,
                   w.closed_loop_concurrency, decode_runs=decode_runs)
    return specs, sim


@pytest.mark.parametrize("decode_runs", [True, False])
def test_a_turn_arrives_its_think_time_after_the_turn_before_it_ended(decode_runs):
    specs, sim = run(workload(turns=4), decode_runs=decode_runs)
    by_id = {r.request_id: r for r in sim.requests}
    links = next_turns(specs)
    assert len(links) == 12 * 3
    for k, nxt in links.items():
        before, after = by_id[str(specs[k].index)], by_id[str(specs[nxt].index)]
        assert after.arrival_time == pytest.approx(before.finish_time + 0.5)


def test_a_turns_prompt_is_the_conversation_so_far_plus_its_user_message():
    specs, sim = run(workload(turns=3))
    by_id = {r.request_id: r for r in sim.requests}
    for k, nxt in next_turns(specs).items():
        before, after = by_id[str(specs[k].index)], by_id[str(specs[nxt].index)]
        history = before.prompt_token_ids + before.output_token_ids
        assert after.prompt_token_ids[:len(history)] == history
        assert after.num_prompt_tokens == before.num_prompt_tokens + 24 + 20
        assert after.num_prompt_tokens == specs[nxt].prompt_len


def test_sessions_raise_the_hit_rate_far_above_single_turns():
    _, single = run(workload(turns=1, num=36))
    _, sessions = run(workload(turns=3, num=12))
    hit_single = summarize(single.requests, single.all_steps, single.duration_s)
    hit_sessions = summarize(sessions.requests, sessions.all_steps, sessions.duration_s)
    assert len(sessions.requests) == len(single.requests) == 36
    assert (hit_single.prefix_cache_hit_rate or 0) < 0.05
    # turns 2 and 3 hold 88 and 132 of their 108 and 152 tokens from before, in whole blocks
    assert hit_sessions.prefix_cache_hit_rate > 0.4


def test_every_turn_ends_exactly_once_and_the_kv_blocks_add_up():
    specs, sim = run(workload(turns=4, think=0.0, arrival={"poisson": {"rate": 50.0}}),
                     blocks=40, max_num_seqs=4, max_model_len=512)
    ids = [r.request_id for r in sim.requests]
    assert len(ids) == len(set(ids)) == len(specs)
    assert all(r.finish_reason is not None and r.finish_reason.completed
               for r in sim.requests)
    assert sim.extra == {"sessions_cut": 0, "turns_not_sent": 0}


def test_a_closed_loop_keeps_sessions_in_flight_not_turns():
    specs, sim = run(workload(turns=3, num=8, think=0.2,
                              arrival={"closed_loop": {"concurrency": 2}}))
    assert len(sim.requests) == len(specs) == 24
    starts = sorted(r.arrival_time for r in sim.requests
                    if specs[int(r.request_id)].turn == 0)
    # two users: a new conversation starts only when one ends (3 turns + 2 thinks later)
    assert starts[:2] == [0.0, 0.0] and starts[2] > 0.4
    in_flight = max(sum(1 for r in sim.requests if r.arrival_time <= t < r.finish_time)
                    for t in (r.arrival_time for r in sim.requests))
    assert in_flight <= 2


def test_a_turn_whose_predecessor_was_refused_ends_its_session():
    # every first prompt (64 tokens) passes max_model_len = 100; later turns would too
    specs, sim = run(workload(turns=3, num=4), max_model_len=60)
    assert len(sim.requests) == 4
    assert all(specs[int(r.request_id)].turn == 0 for r in sim.requests)
    assert sim.extra == {"sessions_cut": 4, "turns_not_sent": 8}
