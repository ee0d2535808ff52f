"""Property tests of prefix caching: random workloads whose prompts share prefixes (and
sometimes a cache salt), every batching and preemption mode, aborts between steps.

A shadow KV store stands in for the runner's: each device slot holds the KV of one token
position, known here by (salt, every token up to and including it). Before a request's
chunk runs, every slot it attends to must hold its own tokens' KV (a cache hit that
names the wrong prefix, a block evicted under its reader, a swap that lost a block, a
tenant reading another's blocks: each shows here); its chunk is then written only into
blocks no other request holds. After every step the scheduler's full integrity check
runs (reference counts equal the tables holding each block, the free queue, the name
map); at the end every request has ended exactly once and no block is held."""

from __future__ import annotations

from factories import FakeRunner, make_scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepserve.core.kv_cache import blocks_for
from stepserve.core.output import RunnerOutput, SchedulerOutput
from stepserve.core.request import Request, SamplingParams
from stepserve.core.scheduler import Scheduler

MAX_LEN = 64


class ShadowKV(FakeRunner):
    def __init__(self, sched) -> None:
        super().__init__(step_s=0.01)
        self.sched = sched
        self.device: dict[tuple[int, int], tuple] = {}
        self.cpu: dict[tuple[int, int], tuple] = {}
        self.reads = 0  # slot reads from blocks the request did not compute itself

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        kv = self.sched.kv
        bs = kv.block_size
        for dev, cpu in out.swap_out:  # before swap_in: it may reuse these device blocks
            for off in range(bs):
                self.cpu[cpu, off] = self.device.get((dev, off))
        for cpu, dev in out.swap_in:
            for off in range(bs):
                self.device[dev, off] = self.cpu.get((cpu, off))
        ref = kv.gpu.ref_cnt
        for r, n, table in zip(out.requests, out.num_scheduled_tokens, out.block_tables,
                               strict=True):
            tokens, start = r.all_token_ids, r.num_computed_tokens
            for p in range(start):
                slot = (table[p // bs], p % bs)
                assert self.device.get(slot) == (r.cache_salt, tuple(tokens[:p + 1])), \
                    f"{r.request_id} reads position {p} from block {slot[0]}: not its KV"
            self.reads += r.prefix_hit_tokens
            for p in range(start, start + n):
                b = table[p // bs]
                assert ref[b] == 1, f"{r.request_id} writes into block {b}, shared ({ref[b]})"
                self.device[b, p % bs] = (r.cache_salt, tuple(tokens[:p + 1]))
        return super().execute(out)


@st.composite
def configs(draw):
    budget = draw(st.integers(8, 96))
    partial = draw(st.integers(1, 3))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    return dict(
        batching=draw(st.sampled_from(["continuous"] * 4 + ["static", "dynamic"])),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=draw(st.integers(0, budget)),
        max_num_partial_prefills=partial,
        max_long_partial_prefills=draw(st.integers(1, partial)),
        budget_order=draw(st.sampled_from(["decode_first", "prefill_first"])),
        policy=draw(st.sampled_from(["fcfs", "priority", "srpt", "fair", "lpm", "lpm"])),
        aging_after_s=draw(st.sampled_from([0.0, 0.05])),
        preemption_mode=draw(st.sampled_from(["recompute", "swap", "none"])),
        block_size=block_size,
        num_cpu_blocks=draw(st.integers(0, 40)),
        watermark=draw(st.sampled_from([0.0, 0.1])),
        num_gpu_blocks=blocks_for(MAX_LEN, block_size) + draw(st.integers(0, 24)),
        max_model_len=MAX_LEN,
    )


@st.composite
def workloads(draw):
    prefixes = draw(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=40),
                             min_size=1, max_size=3))
    n = draw(st.integers(1, 12))
    reqs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05]))
        prefix = draw(st.sampled_from(prefixes))[:draw(st.integers(0, 40))]
        suffix = draw(st.lists(st.integers(1, 3), min_size=0 if prefix else 1, max_size=12))
        params = SamplingParams(
            max_tokens=draw(st.integers(1, 20)), temperature=0.0,
            priority=draw(st.integers(0, 2)), tenant=draw(st.sampled_from(["a", "b"])),
            prompt_logprobs=draw(st.sampled_from([None] * 5 + [0])))
        reqs.append(Request(f"q{i}", prefix + suffix, params, arrival_time=t,
                            eos_token_id=draw(st.sampled_from([None, 7])),
                            cache_salt=draw(st.sampled_from([None, None, "t1"]))))
    aborts = draw(st.lists(st.tuples(st.integers(0, 60), st.integers(0, n - 1)), max_size=3))
    return reqs, aborts


def drive(cfg: dict, reqs: list[Request], aborts: list[tuple[int, int]]):
    cfg = dict(cfg)
    sched = make_scheduler(num_gpu_blocks=cfg.pop("num_gpu_blocks"), **cfg)
    runner = ShadowKV(sched)
    pending = sorted(reqs, key=lambda r: r.arrival_time)
    abort_at = {}
    for when, k in aborts:
        abort_at.setdefault(when, []).append(reqs[k].request_id)
    steps = 0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time <= sched.clock.now():
            sched.add_request(pending.pop(0))
        for rid in abort_at.pop(steps, []):
            sched.abort_request(rid)  # False when it already ended: nothing happens
        sched.check_integrity()
        if not sched.has_unfinished():
            if pending:
                sched.clock.advance_to(pending[0].arrival_time)
            continue
        out = sched.schedule()
        if out.is_empty:
            wake = sched.next_wakeup_time()
            nxt = min([t for t in (wake, pending[0].arrival_time if pending else None)
                       if t is not None], default=None)
            assert nxt is not None or not sched.has_unfinished()
            sched.clock.advance_to(max(nxt or 0.0, sched.clock.now() + 1e-6))
            steps += 1
            continue
        result = runner.execute(out)
        sched.clock.advance(result.elapsed_s)
        sched.update_from_output(out, result)
        sched.check_integrity()
        steps += 1
        assert steps < 5000, "no progress"
    return sched, runner


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), workloads())
def test_shared_prefixes_read_their_own_kv_and_every_request_ends_once(cfg, work):
    reqs, aborts = work
    sched, _ = drive(cfg, reqs, aborts)
    assert sorted(r.request_id for r in sched.finished) == sorted(r.request_id for r in reqs)
    assert len({id(r) for r in sched.finished}) == len(reqs)
    for r in reqs:
        assert r.is_finished and r.finish_time is not None
        assert 0 <= r.num_cached_tokens < max(r.num_prompt_tokens, 1)
        if r.sampling_params.prompt_logprobs is not None:
            assert r.num_cached_tokens == 0
    assert sched.kv.all_free and not sched.kv.num_named
    sched.check_integrity()


def test_the_shadow_store_sees_hits():
    """The property test's workloads do share: a fixed case where most of the prompt
    comes from the cache (so the shadow's checks of cached reads are not vacuous)."""
    shared = [1, 2, 3] * 10
    reqs = [Request(f"q{i}", shared + [i + 1], SamplingParams(max_tokens=4, temperature=0.0),
                    arrival_time=0.01 * i) for i in range(3)]
    cfg = dict(block_size=4, num_gpu_blocks=64, max_model_len=MAX_LEN)
    sched, runner = drive(cfg, reqs, [])
    assert isinstance(sched, Scheduler)
    assert [r.num_cached_tokens for r in reqs] == [0, 28, 28] and runner.reads >= 2 * 28
