"""bench --engine's load (bench/inprocess.run_engine) on the tiny model: open-loop
arrivals issued at their time, a closed loop never over its concurrency, the plan's
duration stopping what is issued, and an interrupt keeping what ended."""

from __future__ import annotations

import pytest

from stepserve.bench.inprocess import run_engine
from stepserve.bench.loadgen import LoadPlan
from stepserve.config.settings import EngineConfig
from stepserve.workload.spec import RequestSpec

pytest.importorskip("torch")


def _engine():
    from stepserve.engine.llm_engine import LLMEngine

    return LLMEngine("tiny", EngineConfig().replace(num_gpu_blocks=128, max_model_len=256,
                                                     max_num_seqs=8))


def _specs(arrivals: list[float], max_tokens: int = 4) -> list[RequestSpec]:
    return [RequestSpec(index=i, arrival_s=a, prompt_len=8, output_len=max_tokens,
                        max_tokens=max_tokens) for i, a in enumerate(arrivals)]


def test_open_loop_issues_each_request_at_its_arrival():
    specs = _specs([0.0, 0.01, 0.02, 0.03, 0.05, 0.08])
    records, keys, series = run_engine(LoadPlan(specs), _engine())
    assert [r.index for r in records] == [s.index for s in specs]
    assert [r.send_s for r in records] == pytest.approx([s.arrival_s for s in specs],
                                                        abs=1e-9)
    assert all(r.output_tokens == 4 and r.finish_reason == "length" and r.error is None
               for r in records)
    assert keys.server_requests_finished == 6 and series is not None


def test_closed_loop_keeps_at_most_its_concurrency_in_flight():
    specs = _specs([0.0] * 7)
    records, keys, _ = run_engine(LoadPlan(specs, concurrency=2), _engine())
    assert len(records) == 7 and all(r.error is None for r in records)
    for r in records:
        in_flight = [o for o in records if o.send_s <= r.send_s < o.end_s]
        assert len(in_flight) <= 2, (r.index, [o.index for o in in_flight])
    assert max(r.send_s for r in records) > 0  # later ones waited for a free slot


def test_the_duration_stops_issuing_measured_requests_not_the_warmup():
    specs = _specs([0.0, 0.0, 0.01, 1.0, 2.0])
    records, _, _ = run_engine(LoadPlan(specs, warmup=2, duration_s=0.5), _engine())
    # the measured requests' 0.5 s start with the first (at 0.01 s): 1 s is past them
    assert [r.index for r in records] == [0, 1, 2]
    assert all(r.error is None for r in records)


def test_an_interrupt_returns_what_ended_and_marks_the_rest():
    specs = _specs([0.0, 0.0, 0.0], max_tokens=20)
    specs[0] = RequestSpec(index=0, arrival_s=0.0, prompt_len=8, output_len=2, max_tokens=2)
    done = []

    def on_done(record):  # Ctrl-C as the first request ends
        done.append(record)
        raise KeyboardInterrupt

    interrupted = [False]
    records, _, _ = run_engine(LoadPlan(specs), _engine(), on_done, interrupted)
    assert interrupted == [True] and len(done) == 1
    assert [r.index for r in records] == [0, 1, 2]
    assert records[0].error is None and records[0].output_tokens == 2
    for r in records[1:]:
        assert r.error == "interrupted before the response ended" and r.status == 200
        assert r.output_tokens < 20
