"""The engine core: the one loop body every driver shares.

    step() = begin_step()        schedule(), then runner.execute(out)
             complete_step()     update_from_output() -> StepResult

No torch here: the simulator drives this core on a virtual clock with a cost-model
runner. Every end from outside a step goes through `finish_request` (exactly once, in
the next result's `finished`); drivers read state through `snapshot()`. A runner fault
ends exactly the requests its step touched (FINISHED_ERROR); MAX_CONSECUTIVE_STEP_FAILURES
in a row raise `EngineDead`. A scheduler fault raises as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stepserve.config.settings import EngineConfig
from stepserve.core import make_scheduler
from stepserve.core.base import SchedulerBase, integrity_checks_on
from stepserve.core.clock import Clock
from stepserve.core.decode_run import DecodeRun, Sampler, run_decodes
from stepserve.core.end_reasons import FINISH_REASON_OF
from stepserve.core.output import RunnerOutput, SchedulerOutput, StepResult
from stepserve.core.request import FinishReason, Request, RequestStatus

log = logging.getLogger("stepserve.engine")

# failed steps in a row that mean a broken runner: stop, so a supervisor restarts it
MAX_CONSECUTIVE_STEP_FAILURES = 3


# A driver ends a request with any end but admission's own refusal.
_STATUS_OF = {reason: status for status, reason in FINISH_REASON_OF.items()
              if status is not RequestStatus.FINISHED_REJECTED}
_DRIVER_ENDS = frozenset(_STATUS_OF.values())


def default_max_tokens(max_model_len: int, num_prompt_tokens: int) -> int:
    """max_tokens=None, as vLLM reads it: the room max_model_len leaves after the prompt
    (at least 1, so a prompt filling the context is refused by its length)."""
    return max(max_model_len - num_prompt_tokens, 1)


class EngineDead(RuntimeError):
    """The engine cannot go on (its runner failed step after step)."""


class Runner(Protocol):
    """`execute` a batch (`reads_block_tables = False`: without block tables)."""

    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...


@dataclass(slots=True)
class PendingStep:
    """A step begun: its batch and what the runner made of it (None: nothing ran)."""

    out: SchedulerOutput | None = None
    result: RunnerOutput | None = None

    @property
    def ran(self) -> bool:
        return self.result is not None

    @property
    def elapsed_s(self) -> float:
        return self.result.elapsed_s if self.result is not None else 0.0


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What a driver may read of the core's state between steps (queues, KV blocks, the
    prefix cache's counters), so the core can change how it keeps them."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_gpu_blocks: int
    num_gpu_blocks_used: int  # held by some request (cached free blocks are free)
    kv_usage: float  # num_gpu_blocks_used / num_gpu_blocks, 0..1
    num_cpu_blocks: int
    num_cpu_blocks_used: int  # holding swapped-out requests
    num_preemptions_total: int
    # the prefix cache's counters, in tokens (vLLM's prefix_cache_queries / _hits)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def num_queued(self) -> int:
        """Requests waiting for a slot: not yet running, or swapped out."""
        return self.num_waiting + self.num_swapped

    @property
    def all_free(self) -> bool:
        """No block is held, on the device or in the CPU pool."""
        return self.num_gpu_blocks_used == 0 and self.num_cpu_blocks_used == 0


class EngineCore:
    def __init__(self, config: EngineConfig, runner: Runner, clock: Clock,
                 num_gpu_blocks: int) -> None:
        """`num_gpu_blocks`: the device KV pool the runner holds."""
        self.config = config
        self.runner = runner
        self.clock = clock
        self.scheduler: SchedulerBase = make_scheduler(config, clock, num_gpu_blocks)
        self.scheduler.fills_block_tables = getattr(runner, "reads_block_tables", True)
        self._failed_in_a_row = 0
        self.integrity_checks = integrity_checks_on()
        self._unchecked_steps = 0

    # ---- requests ----
    def add_request(self, request: Request) -> bool:
        """Queue `request`; False if admission refused it (finished with its reason, in
        no StepResult)."""
        if request.max_tokens is None:
            request.max_tokens = default_max_tokens(self.config.scheduler.max_model_len,
                                                    request.num_prompt_tokens)
        if self.scheduler.add_request(request):
            return True
        self.scheduler.finished.remove(request)  # answered here, not again in a result
        return False

    def finish_request(self, request_id: str, reason: RequestStatus | FinishReason,
                       message: str = "", stop_reason: str | None = None) -> bool:
        """End a live request now (in the next StepResult's `finished`). `reason`: a
        finished RequestStatus or FinishReason; `stop_reason`: the stop string that ended
        it. False, nothing done, if it is unknown or already ended."""
        status = _STATUS_OF.get(reason) if isinstance(reason, FinishReason) else reason
        if status not in _DRIVER_ENDS:
            allowed = ", ".join(s.name for s in _STATUS_OF.values())
            raise ValueError(f"cannot end a request as {reason!r}: a driver ends one as "
                             f"{allowed} (rejection is admission's own)")
        status = RequestStatus(status)
        if stop_reason is not None and status is not RequestStatus.FINISHED_STOPPED:
            raise ValueError(f"stop_reason {stop_reason!r} with {status.name}: only a "
                             f"request that stopped has a stop reason")
        return self.scheduler.finish_request(request_id, status, message, stop_reason)

    def abort_request(self, request_id: str, message: str = "aborted by the client") -> bool:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED, message)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_wakeup_time(self) -> float | None:
        return self.scheduler.next_wakeup_time()

    # ---- what drivers read ----
    def snapshot(self) -> EngineSnapshot:
        sched = self.scheduler
        kv = sched.kv
        gpu, cpu = kv.gpu, kv.cpu
        return EngineSnapshot(
            len(sched.running), len(sched.waiting), len(sched.swapped),
            gpu.num_blocks, gpu.num_blocks - gpu.num_free, kv.usage,
            cpu.num_blocks, cpu.num_blocks - cpu.num_free, sched.num_preemptions_total,
            kv.prefix_cache_queries, kv.prefix_cache_hits)

    def check_integrity(self) -> None:
        """Raise KVCacheError unless the blocks and the queues agree (the full check)."""
        self.scheduler.check_integrity(full=True)

    # ---- the loop body ----
    def step(self) -> StepResult:
        return self.complete_step(self.begin_step())

    def begin_step(self) -> PendingStep:
        out = self.scheduler.schedule()
        if out.is_empty:
            return PendingStep()
        try:
            result = self.runner.execute(out)
        except Exception as e:
            self._step_failed(out, e)
            return PendingStep()
        self._failed_in_a_row = 0
        return PendingStep(out, result)

    def complete_step(self, pending: PendingStep) -> StepResult:
        sched = self.scheduler
        if pending.out is None or pending.result is None:
            if self.integrity_checks:
                self._check(idle=True)
            return StepResult(None, [], sched.take_finished())
        emitted = sched.update_from_output(pending.out, pending.result)
        if pending.result.logprobs is not None or pending.result.prompt_logprobs is not None:
            _keep_logprobs(pending.out, pending.result)
        (record,) = sched.take_step_records()
        if self.integrity_checks:
            self._check()
        return StepResult(record, emitted, sched.take_finished())

    def take_finished(self) -> list[Request]:
        """The requests ended since the last result (e.g. by a driver's stop string)."""
        return self.scheduler.take_finished()

    def run_decodes(self, start: float, until: float,
                    step_time: Callable[[int, int], float], sampler: Sampler,
                    stop_at_first_end: bool = False,
                    straddle: bool = False) -> DecodeRun | None:
        """The simulator's fast path (core/decode_run.py); None: step() as usual."""
        run = run_decodes(self.scheduler, start, until, step_time, sampler,
                          stop_at_first_end, straddle)
        if run is not None and self.integrity_checks:
            self._check()
        return run

    # The debug switch: counts every step, the full check every FULL_CHECK_EVERY steps,
    # when idle, and on small pools (at 2,048 blocks, every step doubled promo-spike's time).
    FULL_CHECK_EVERY = 64
    FULL_CHECK_BLOCKS = 256

    def _check(self, idle: bool = False) -> None:
        sched = self.scheduler
        self._unchecked_steps += 1
        full = (idle or self._unchecked_steps >= self.FULL_CHECK_EVERY
                or not sched.has_unfinished()
                or sched.kv.num_gpu_blocks <= self.FULL_CHECK_BLOCKS)
        sched.check_integrity(full)
        if full:
            self._unchecked_steps = 0

    def _step_failed(self, out: SchedulerOutput, error: Exception) -> None:
        self._failed_in_a_row += 1
        message = f"the engine step failed: {type(error).__name__}: {error}"
        log.error("step %d failed; ending its %d requests", out.step_index,
                  len(out.requests), exc_info=error)
        self.scheduler.fail_step(out, message)
        if self._failed_in_a_row >= MAX_CONSECUTIVE_STEP_FAILURES:
            raise EngineDead(f"{self._failed_in_a_row} engine steps failed in a row; the "
                             f"last: {message}") from error


def _keep_logprobs(out: SchedulerOutput, result: RunnerOutput) -> None:
    """Append the step's logprobs to their requests, exactly one per output token (none
    for a request aborted while the step ran)."""
    for i, req in enumerate(out.requests):
        if result.prompt_logprobs is not None and req.prompt_logprobs is not None:
            found = result.prompt_logprobs[i]
            if found:
                req.prompt_logprobs += found
        lp = result.logprobs[i] if result.logprobs is not None else None
        kept = req.output_logprobs
        if lp is not None and kept is not None and len(kept) < len(req.output_token_ids) \
                and req.output_token_ids[-1] == lp.token_id:
            kept.append(lp)
