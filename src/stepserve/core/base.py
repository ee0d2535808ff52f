"""What every scheduler shares: admission, the request lifecycle (each request ends
exactly once, with a reason), applying a runner's output, a StepRecord per step.
Subclasses decide only how a batch is filled (`fill`)."""

from __future__ import annotations

import os
from operator import attrgetter

from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.clock import Clock
from stepserve.core.end_reasons import FINISH_REASON_OF
from stepserve.core.kv_cache import KVCacheError, KVCacheManager, blocks_for
from stepserve.core.output import RunnerOutput, SchedulerOutput, StepRecord
from stepserve.core.policies import make_policy
from stepserve.core.request import RejectReason, Request, RequestStatus

_RUNNING = RequestStatus.RUNNING
_REQUEST_ID = attrgetter("request_id")
_FINISHED_LENGTH = RequestStatus.FINISHED_LENGTH
_FINISHED_STOPPED = RequestStatus.FINISHED_STOPPED

# The debug switch (the test suite sets it): check blocks and queues after every step.
CHECK_INTEGRITY_ENV = "STEPSERVE_CHECK_INTEGRITY"


def integrity_checks_on() -> bool:
    return os.environ.get(CHECK_INTEGRITY_ENV, "").strip().lower() in ("1", "true", "yes")


def check_holds_one_sequence(num_gpu_blocks: int, block_size: int, max_model_len: int,
                             source: str = "cache.num_gpu_blocks") -> None:
    """One sequence of max_model_len must fit (as vLLM asks), watermark aside; the
    simulator asks this before it reads a workload, the scheduler when it is built.
    `source`: what gave the count, for the message."""
    need = blocks_for(max_model_len, block_size)
    if num_gpu_blocks < need:
        raise ConfigError(
            f"{source} = {num_gpu_blocks:,} (block_size {block_size}) cannot hold one "
            f"sequence of max_model_len = {max_model_len:,} tokens ({need:,} blocks); add "
            "blocks or lower max_model_len")


class SchedulerBase:
    # off for a runner that never reads block ids (the simulator's)
    fills_block_tables = True

    def __init__(self, config: EngineConfig, kv: KVCacheManager, clock: Clock) -> None:
        self.config = config
        self.sc = config.scheduler
        self.qc = config.queue
        self.kv = kv
        self.clock = clock
        self.policy = make_policy(self.sc.policy, self.qc.aging_after_s,
                                  lambda r: len(kv.cached_prefix(r)) * kv.block_size)
        check_holds_one_sequence(kv.num_gpu_blocks, kv.block_size, self.sc.max_model_len)
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admission order
        self.swapped: list[Request] = []
        self.requests: dict[str, Request] = {}  # live requests by id
        self.finished: list[Request] = []  # every ended request, in the order it ended
        self.step_records: list[StepRecord] = []
        self.num_preemptions_total = 0
        self.step_index = 0  # the index the next step gets
        self._admit_seq = 0
        self.freed_ids: list[str] = []  # ended since the last schedule(): told to runners
        self._finished_taken = self._records_taken = 0  # how much of each log was taken

    # ---- admission ----
    def add_request(self, request: Request) -> bool:
        """Queue `request`, or end it at once as rejected (with a reason) and return False."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        limit = self.sc.max_model_len
        reason, why = "", None
        if request.num_prompt_tokens == 0:
            reason, why = ("the prompt is empty; at least one token is required",
                           RejectReason.EMPTY_PROMPT)
        elif request.max_total_tokens > limit:
            reason, why = (f"prompt ({request.num_prompt_tokens} tokens) + max_tokens "
                           f"({request.max_tokens}) = {request.max_total_tokens} exceeds "
                           f"max_model_len = {limit}", RejectReason.TOO_LONG)
        elif self.qc.max_waiting and len(self.waiting) >= self.qc.max_waiting:
            reason, why = (f"queue full: {len(self.waiting)} requests waiting, max_waiting "
                           f"= {self.qc.max_waiting}; retry later", RejectReason.QUEUE_FULL)
        if why is not None:
            request.reject_reason = why
            self.end_request(request, RequestStatus.FINISHED_REJECTED, reason)
            return False
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.policy.on_add(request)
        return True

    # ---- ending requests ----
    def finish_request(self, request_id: str, status: RequestStatus, message: str = "",
                       stop_reason: str | int | None = None) -> bool:
        """End a live request from outside a step; False if unknown or already ended."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
                break
        self.end_request(request, status, message, stop_reason=stop_reason)
        return True

    def abort_request(self, request_id: str, message: str = "aborted by the client") -> bool:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED, message)

    def fail_step(self, out: SchedulerOutput, message: str) -> list[Request]:
        """The runner could not execute `out`: end as FINISHED_ERROR (and return) every
        request whose KV it touched (batch, swap-outs, swap-ins); the others run on."""
        touched = list(out.requests)
        touched += [r for r in out.preempted if r.status is RequestStatus.SWAPPED]
        swapped_in = {device for _, device in out.swap_in}
        if swapped_in:
            tables = self.kv.block_tables
            touched += [r for r in self.running
                        if swapped_in.intersection(tables.get(r.request_id, ()))]
        return [r for r in dict.fromkeys(touched)
                if self.finish_request(r.request_id, RequestStatus.FINISHED_ERROR, message)]

    def end_request(self, request: Request, status: RequestStatus, message: str = "",
                    now: float | None = None, stop_reason: str | int | None = None) -> None:
        """End `request` with `status` (at `now`, default the clock's): the one way any
        request ends. The caller has taken it out of its queue; its blocks are freed, the
        runner told at the next step, the end logged in `finished` once."""
        if request.is_finished:
            raise RuntimeError(f"request {request.request_id} ended twice")
        request.status = status
        request.finish_reason = FINISH_REASON_OF[status]
        request.finish_message = message
        request.stop_reason = stop_reason
        request.finish_time = self.clock.now() if now is None else now
        self.finished.append(request)
        if status is RequestStatus.FINISHED_REJECTED:
            return  # never admitted: no blocks, no policy state, nothing for the runner
        self.kv.free(request)
        del self.requests[request.request_id]
        self.freed_ids.append(request.request_id)
        self.policy.on_finish(request)

    def _expire_waiting(self, now: float) -> None:
        """End requests that waited longer than max_queue_time_s before first running."""
        limit = self.qc.max_queue_time_s
        expired = [r for r in self.waiting
                   if r.first_scheduled_time is None and now - r.arrival_time > limit]
        if not expired:
            return
        gone = set(map(id, expired))
        self.waiting = [r for r in self.waiting if id(r) not in gone]
        for r in expired:
            self.end_request(r, RequestStatus.FINISHED_TIMED_OUT,
                      f"waited {now - r.arrival_time:.3f} s in the queue, over "
                      f"max_queue_time_s = {limit}")

    # ---- what the engine core takes after every step ----
    # Logs read whole by hand-driven schedulers; the engine core takes what is new, and
    # taken entries are dropped past LOG_KEEP so a long-running server stays bounded.
    LOG_KEEP = 4096

    def take_finished(self) -> list[Request]:
        """The requests that ended since the last call, in the order they ended."""
        new, self._finished_taken = _take_new(self.finished, self._finished_taken,
                                              self.LOG_KEEP)
        return new

    def take_step_records(self) -> list[StepRecord]:
        """The steps recorded since the last call."""
        new, self._records_taken = _take_new(self.step_records, self._records_taken,
                                             self.LOG_KEEP)
        return new

    # ---- state ----
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def check_integrity(self, full: bool = True) -> None:
        """Raise KVCacheError unless the block manager's invariant holds, every live
        request is in one queue, and exactly the running (swapped) requests hold device
        (CPU) blocks, covering their computed tokens. `full=False`: counts only."""
        kv = self.kv
        kv.check_integrity(full)
        live = self.requests
        queues = (self.waiting, self.running, self.swapped)
        queued = sum(map(len, queues))
        if queued != len(live) or (full and {r.request_id for q in queues for r in q}
                                   != live.keys()):
            raise KVCacheError(f"queues hold {queued} requests, the live table {len(live)}, "
                               f"or they name different requests")
        if not (kv.block_tables.keys() <= live.keys() and kv.cpu_tables.keys() <= live.keys()):
            leaked = (kv.block_tables.keys() | kv.cpu_tables.keys()) - live.keys()
            raise KVCacheError(f"blocks held by ended or unknown request {sorted(leaked)[0]!r}")
        if len(kv.block_tables) != len(self.running) or \
                len(kv.cpu_tables) != len(self.swapped):
            raise KVCacheError(f"{len(kv.block_tables)} device tables for {len(self.running)} "
                               f"running requests, {len(kv.cpu_tables)} CPU tables for "
                               f"{len(self.swapped)} swapped ones")
        if not full:
            return
        for req in self.running:
            table = kv.block_tables.get(req.request_id)
            if table is None or req.num_computed_tokens > len(table) * kv.block_size:
                raise KVCacheError(f"running request {req.request_id!r}: "
                                   f"{req.num_computed_tokens} tokens computed, its table "
                                   f"holds {0 if table is None else len(table)} blocks")

    def next_wakeup_time(self) -> float | None:
        """When schedule() may have work again without a new arrival (None: not by itself)."""
        return None

    # ---- forming a step's batch ----
    def schedule(self) -> SchedulerOutput:
        """This step's batch: queue timeouts, then the subclass's `fill`."""
        now = self.clock.now()
        out = SchedulerOutput(step_index=self.step_index)
        self.step_index += 1
        if self.freed_ids:
            out.finished_request_ids, self.freed_ids = self.freed_ids, []
        if self.qc.max_queue_time_s and self.waiting:
            self._expire_waiting(now)
        self.fill(out, now)
        if self.fills_block_tables:
            out.block_tables = list(map(self.kv.block_tables.__getitem__,
                                        map(_REQUEST_ID, out.requests)))
        return out

    def fill(self, out: SchedulerOutput, now: float) -> None:
        """Put this step's requests into `out` (the batching policy of a subclass)."""
        raise NotImplementedError

    # ---- applying a step ----
    def update_from_output(self, out: SchedulerOutput, result: RunnerOutput) -> list[Request]:
        """Apply a step: tokens, stop conditions, the record; returns who got a token."""
        now = self.clock.now()
        requests, counts = out.requests, out.num_scheduled_tokens
        if self.policy.tracks_tokens:  # fair share counts each tenant's computed tokens
            on_tokens = self.policy.on_tokens
            for req, n in zip(requests, counts):
                if req.status is _RUNNING:
                    on_tokens(req, n)
        emitted: list[Request] = []
        emit = emitted.append
        ended: list[Request] = []
        # A block is cached once a completed step crosses its end (computed % bs < n),
        # never when scheduled: a failed or preempted step caches nothing half-computed.
        cache_blocks = self.kv.cache_blocks
        # with caching off, a "block" no step's tokens ever cross: one test a token, not two
        bs = self.kv.block_size if self.kv.enable_prefix_caching else 1 << 62
        # the hottest loop with schedule_running; admission already bounds max_model_len
        for req, n, tok in zip(requests, counts, result.sampled_token_ids):
            if req.status is not _RUNNING:
                continue  # ended (aborted) while the step ran
            computed = req.num_computed_tokens = req.num_computed_tokens + n
            if computed % bs < n:
                cache_blocks(req, computed)
            if tok is None:
                continue
            output = req.output_token_ids
            output.append(tok)
            req.token_times.append(now)
            emit(req)
            if len(output) >= req.max_tokens:
                self.end_request(req, _FINISHED_LENGTH)
                ended.append(req)
            elif tok in req.stop_ids and len(output) >= req.min_tokens:
                # EOS (unless ignore_eos) or a stop id; none before min_tokens (vLLM)
                self.end_request(req, _FINISHED_STOPPED,
                                 stop_reason=None if tok == req.stop_eos else tok)
                ended.append(req)
        for req in ended:  # a few per step: list.remove beats rebuilding `running`
            self.running.remove(req)
        self.step_records.append(StepRecord(
            index=out.step_index, start_s=now - result.elapsed_s, duration_s=result.elapsed_s,
            num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
            num_scheduled_seqs=len(out.requests), num_decode_ready=out.num_decode_ready,
            num_running=len(self.running), num_waiting=len(self.waiting),
            num_swapped=len(self.swapped), num_preempted=len(out.preempted),
            kv_usage=self.kv.usage, slots_held=out.slots_held, num_active=len(emitted)))
        return emitted

    def _admit(self, request: Request, now: float) -> None:
        request.status = _RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        request.admitted_seq = self._admit_seq
        self._admit_seq += 1
        self.running.append(request)


def _take_new(log: list, taken: int, keep: int) -> tuple[list, int]:
    """What `log` gained past `taken`, and the new count (dropped past `keep`)."""
    new = log[taken:]
    if len(log) > keep:
        del log[:]
    return new, len(log)
