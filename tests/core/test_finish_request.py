"""One way for a driver to end a request: `EngineCore.finish_request` ends it exactly once
whatever it is doing (waiting, running, swapped), frees its blocks and reports it in the
next StepResult as every other end is; a stop token's `stop_reason` is recorded where the
stop is detected; `snapshot()` is what drivers read of the core's state."""

from __future__ import annotations

import pytest
from factories import FakeRunner, make_config, make_requests

from stepserve.core.clock import VirtualClock
from stepserve.core.decode_run import Sampler
from stepserve.core.end_reasons import FINISH_REASON_OF
from stepserve.core.engine_core import EngineCore, EngineSnapshot, default_max_tokens
from stepserve.core.request import FinishReason, Request, RequestStatus, SamplingParams

EOS = 2


def make_core(num_gpu_blocks: int = 64, runner: FakeRunner | None = None,
              **settings) -> EngineCore:
    settings.setdefault("max_model_len", 256)
    return EngineCore(make_config(**settings), runner or FakeRunner(),
                      VirtualClock(), num_gpu_blocks)


def finished_ids(core: EngineCore, steps: int = 1) -> list[str]:
    return [r.request_id for _ in range(steps) for r in core.step().finished]


@pytest.mark.parametrize("reason", [RequestStatus.FINISHED_ABORTED, FinishReason.ABORT,
                                    RequestStatus.FINISHED_ERROR, FinishReason.TIMED_OUT])
def test_a_running_request_ends_once_frees_its_blocks_and_is_reported_once(reason):
    core = make_core()
    a, b = make_requests(2, prompt_len=20, max_tokens=50)
    core.add_request(a), core.add_request(b)
    core.step()
    assert core.snapshot().num_running == 2 and core.snapshot().num_gpu_blocks_used > 0
    assert core.finish_request("r0", reason, "the client went away")
    assert not core.finish_request("r0", reason, "again")  # a no-op: it ended already
    assert not core.abort_request("r0")
    assert a.is_finished and a.finish_message == "the client went away"
    assert a.finish_reason is (reason if isinstance(reason, FinishReason)
                               else FINISH_REASON_OF[reason])
    assert a.stop_reason is None
    snap = core.snapshot()
    assert snap.num_running == 1 and snap.num_waiting == 0
    assert finished_ids(core) == ["r0"]  # in the next result, like any end
    assert "r0" not in finished_ids(core, 3)  # and never again
    while core.has_unfinished():
        core.step()
    assert core.snapshot().all_free


def test_a_waiting_request_ends_before_it_ever_runs():
    core = make_core(max_num_seqs=1)
    a, b = make_requests(2, prompt_len=8, max_tokens=20)
    core.add_request(a), core.add_request(b)
    core.step()
    assert core.snapshot().num_waiting == 1
    assert core.finish_request("r1", RequestStatus.FINISHED_ABORTED, "gone")
    assert core.snapshot().num_waiting == 0
    assert finished_ids(core) == ["r1"] and b.first_scheduled_time is None


def test_a_swapped_request_gives_back_its_cpu_blocks():
    # two requests outgrow 8 blocks of 16 tokens: one is swapped out to the CPU pool
    core = make_core(num_gpu_blocks=8, preemption_mode="swap", num_cpu_blocks=16,
                     block_size=16, max_model_len=128)
    for r in make_requests(2, prompt_len=40, max_tokens=80):
        core.add_request(r)
    while core.snapshot().num_swapped == 0:
        assert core.has_unfinished(), "the test must swap a request out"
        core.step()
    snap = core.snapshot()
    assert snap.num_cpu_blocks == 16 and snap.num_cpu_blocks_used > 0
    (swapped,) = [r for r in core.scheduler.swapped]
    assert core.abort_request(swapped.request_id)
    after = core.snapshot()
    assert after.num_swapped == 0 and after.num_cpu_blocks_used == 0
    assert swapped.request_id in finished_ids(core)


def test_an_unknown_request_is_a_no_op():
    core = make_core()
    assert not core.finish_request("nobody", RequestStatus.FINISHED_ABORTED)
    assert core.step().finished == []


@pytest.mark.parametrize("reason", [RequestStatus.RUNNING, RequestStatus.WAITING,
                                    RequestStatus.FINISHED_REJECTED, FinishReason.REJECTED,
                                    "abort"])
def test_an_end_a_driver_cannot_give_is_refused_by_name(reason):
    core = make_core()
    (req,) = make_requests(1)
    core.add_request(req)
    with pytest.raises(ValueError, match="cannot end a request as .*FINISHED_ABORTED"):
        core.finish_request("r0", reason)
    assert not req.is_finished


def test_a_stop_reason_belongs_to_a_stop_only():
    core = make_core()
    (req,) = make_requests(1)
    core.add_request(req)
    with pytest.raises(ValueError, match="only a request that stopped"):
        core.finish_request("r0", RequestStatus.FINISHED_ABORTED, stop_reason="###")
    assert core.finish_request("r0", FinishReason.STOP, "stop string '###'",
                               stop_reason="###")
    assert req.status is RequestStatus.FINISHED_STOPPED and req.stop_reason == "###"


def _request(rid: str, token: int, **params) -> Request:
    return Request(rid, [100 + int(rid[1:]), 1, 1], SamplingParams(temperature=0.0, **params),
                   arrival_time=0.0, eos_token_id=EOS)


@pytest.mark.parametrize("token, params, status, stop_reason", [
    (9, dict(stop_token_ids=[9], max_tokens=8), RequestStatus.FINISHED_STOPPED, 9),
    (EOS, dict(max_tokens=8), RequestStatus.FINISHED_STOPPED, None),  # EOS: none (vLLM)
    (EOS, dict(stop_token_ids=[EOS], max_tokens=8), RequestStatus.FINISHED_STOPPED, None),
    (EOS, dict(stop_token_ids=[EOS], ignore_eos=True, max_tokens=8),
     RequestStatus.FINISHED_STOPPED, EOS),
    (5, dict(stop_token_ids=[9], max_tokens=3), RequestStatus.FINISHED_LENGTH, None),
], ids=["stop-token", "eos", "eos-also-a-stop-token", "ignored-eos-as-stop-token", "length"])
@pytest.mark.parametrize("decode_runs", [False, True], ids=["steps", "decode-run"])
def test_the_stop_token_is_recorded_where_the_stop_is_detected(token, params, status,
                                                               stop_reason, decode_runs):
    core = make_core(runner=FakeRunner(token=token))
    req = _request("r0", token, **params)
    core.add_request(req)
    core.step()  # the prefill samples the first token
    if decode_runs and not req.is_finished:
        sampler = Sampler(token, EOS, lambda batch, held: [10**6] * len(batch))
        run = core.run_decodes(core.clock.now(), 1e9, lambda n, ctx: 0.01, sampler)
        assert run is not None and run.finished == [req]
    while core.has_unfinished():
        core.step()
    assert req.status is status and req.stop_reason == stop_reason


def test_snapshot_is_what_the_queues_and_blocks_say():
    core = make_core(num_gpu_blocks=32, max_num_seqs=2, block_size=16)
    for r in make_requests(3, prompt_len=20, max_tokens=10):
        core.add_request(r)
    snap = core.snapshot()
    assert snap == EngineSnapshot(0, 3, 0, 32, 0, 0.0, 0, 0, 0, 0, 0)
    assert snap.num_queued == 3 and snap.all_free
    core.step()
    snap = core.snapshot()
    assert (snap.num_running, snap.num_waiting, snap.num_gpu_blocks_used) == (2, 1, 4)
    assert snap.kv_usage == pytest.approx(4 / 32) and not snap.all_free
    with pytest.raises(AttributeError):
        snap.num_running = 0  # type: ignore[misc]


def test_check_integrity_on_the_core():
    core = make_core()
    (req,) = make_requests(1, prompt_len=8, max_tokens=4)
    core.add_request(req)
    core.step()
    core.check_integrity()
    core.scheduler.running.append(req)  # one request in a queue twice
    with pytest.raises(Exception, match="queues hold"):
        core.check_integrity()


def test_max_tokens_none_is_resolved_in_one_place():
    core = make_core()
    req = Request("r0", [1] * 56, SamplingParams(max_tokens=None), arrival_time=0.0)
    assert core.add_request(req)
    assert req.max_tokens == default_max_tokens(256, 56) == 200
    assert default_max_tokens(256, 256) == 1  # a full context: refused by its length


def test_snapshot_carries_the_prefix_cache_counters():
    core = make_core(block_size=16)
    first, second = make_requests(2, prompt=list(range(1, 41)), max_tokens=2)
    core.add_request(first)
    while core.has_unfinished():
        core.step()
    core.add_request(second)
    core.step()
    kv = core.scheduler.kv
    snap = core.snapshot()
    assert snap.prefix_cache_hits == kv.prefix_cache_hits == 32  # two full blocks
    assert snap.prefix_cache_queries == kv.prefix_cache_queries == 80
