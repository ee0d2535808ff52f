"""Test factories shared by every test folder: `make_scheduler(**overrides)` and
`make_requests(n, ...)` build the objects, `step` and `run_until_done` drive them by hand
through the real engine core (core/engine_core.py), as every driver does."""

from __future__ import annotations

import itertools

from stepserve.config.settings import EngineConfig
from stepserve.core.base import SchedulerBase, integrity_checks_on
from stepserve.core.clock import VirtualClock
from stepserve.core.engine_core import EngineCore
from stepserve.core.kv_cache import KVCacheManager
from stepserve.core.output import RunnerOutput, SchedulerOutput
from stepserve.core.request import Request, SamplingParams

SETTINGS_DEFAULTS = dict(max_model_len=2048)


def make_config(**overrides) -> EngineConfig:
    settings = {**SETTINGS_DEFAULTS, **overrides}
    return EngineConfig().replace(**settings)


def make_scheduler(num_gpu_blocks: int = 1024, clock: VirtualClock | None = None,
                   **overrides) -> SchedulerBase:
    """A scheduler on a virtual clock, inside the engine core that `step` drives; any
    config setting can be overridden by name."""
    overrides.setdefault("watermark", 0.0)
    core = EngineCore(make_config(**overrides), FakeRunner(), clock or VirtualClock(),
                      num_gpu_blocks)
    core.scheduler.engine_core = core  # (a test holds the scheduler; `step` finds its core)
    return core.scheduler


# Each made prompt starts with a token no other has, so requests share no cached prefix
# unless a test asks for one (`prompt=`): prefix caching is on by default.
_FIRST_IDS = itertools.count(100_000)


def make_requests(n: int, prompt_len: int = 8, max_tokens: int = 4, *, arrival: float = 0.0,
                  prefix: str = "r", priority: int = 0, tenant: str = "default",
                  ignore_eos: bool = True, eos_token_id: int | None = None,
                  prompt: list[int] | None = None,
                  cache_salt: str | None = None) -> list[Request]:
    """`n` requests of distinct prompts of `prompt_len` tokens, or all of `prompt`."""
    return [Request(request_id=f"{prefix}{i}",
                    prompt_token_ids=list(prompt) if prompt is not None
                    else [next(_FIRST_IDS), *[1] * (prompt_len - 1)][:prompt_len],
                    sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                   ignore_eos=ignore_eos, priority=priority,
                                                   tenant=tenant),
                    arrival_time=arrival, eos_token_id=eos_token_id, cache_salt=cache_salt)
            for i in range(n)]


def kv_manager(runner) -> KVCacheManager:
    """A block manager over a runner's KV store (the engine core owns one; tests that
    drive a runner by hand own theirs)."""
    return KVCacheManager(runner.num_gpu_blocks, runner.block_size, runner.num_cpu_blocks)


def batch(step: int, reqs, counts, mgr: KVCacheManager, **kw) -> SchedulerOutput:
    """A SchedulerOutput of `reqs` computing `counts` tokens, with their block tables."""
    return SchedulerOutput(step, list(reqs), list(counts),
                           block_tables=[mgr.block_table(r.request_id) for r in reqs], **kw)


class FakeRunner:
    """Samples token 7 wherever a chunk reaches the end of its sequence; fixed step time."""

    def __init__(self, step_s: float = 0.01, token: int = 7) -> None:
        self.step_s = step_s
        self.token = token

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        sampled = [self.token if r.num_computed_tokens + n == r.num_tokens else None
                   for r, n in zip(out.requests, out.num_scheduled_tokens)]
        return RunnerOutput(sampled, self.step_s)


def step(sched: SchedulerBase, runner: FakeRunner | None = None) -> SchedulerOutput | None:
    """One step of the engine core around `sched` (from `make_scheduler`), on its virtual
    clock: begin (schedule, execute), advance the clock by the step's time, complete
    (update). Returns the step's batch; None if nothing was scheduled (the clock is then
    moved to the scheduler's next wakeup, if it has one). With the debug switch on, the
    blocks are fully checked after every step, not only every FULL_CHECK_EVERY steps."""
    core: EngineCore = sched.engine_core
    core.runner = runner or FakeRunner()
    pending = core.begin_step()
    if pending.ran:
        sched.clock.advance(pending.elapsed_s)
    elif (wake := core.next_wakeup_time()) is not None:
        sched.clock.advance_to(wake)
    core.complete_step(pending)
    if integrity_checks_on():
        core.check_integrity()
    return pending.out


def run_until_done(sched: SchedulerBase, runner: FakeRunner | None = None,
                   max_steps: int = 100_000) -> list[SchedulerOutput]:
    """Step until nothing is left; the batches of the steps that ran."""
    outs = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return outs
        if (out := step(sched, runner)) is not None:
            outs.append(out)
    raise AssertionError(f"not done after {max_steps} steps")
