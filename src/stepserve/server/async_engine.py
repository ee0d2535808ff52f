"""AsyncEngine: the engine client of one process (engine/seam.py): the LLMEngine's step
loop on a thread of its own (`EngineLoop`), one asyncio stream per request; and
`drain_live`, the shutdown drain it shares with the cluster's ClusterEngine.

Invariants:
* Only the engine thread touches the engine; it sleeps on an Event a command sets. An
  abort is applied before the next step.
* Exactly one answer per accepted request: admission raises (RequestRejected,
  EngineUnavailable) or returns a stream that gets exactly one final output. A fault in
  a step ends the requests it touched with "error"; a fault of the loop itself answers
  every live request and pending admission, and calls `on_fatal` (the server exits).
* One iteration reaches the event loop as one outbox message (one call_soon_threadsafe
  per step, not per token). AsyncEngine touches only EngineLoop's command queue, wake-up
  event, outbox and published state; EngineLoop calls nothing of AsyncEngine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from stepserve.core.end_reasons import FinishReason
from stepserve.core.engine_core import EngineSnapshot
from stepserve.engine.seam import (
    EngineUnavailable,
    InvalidRequest,
    NewRequest,
    RequestFailed,
    RequestRejected,
    RequestStream,
    StreamOutput,
)

if TYPE_CHECKING:
    from stepserve.engine.llm_engine import EngineStep, LLMEngine
    from stepserve.engine.outputs import Outputs as EngineOutputs
    from stepserve.server.metrics import ServerMetrics

log = logging.getLogger("stepserve.server")

IDLE_POLL_S = 0.002  # work is queued but nothing could be scheduled: look again soon
ABORTED_END_WAIT_S = 10.0  # how long aborted requests get to hand over their final output

Outputs = list[tuple[RequestStream, StreamOutput]]
Admissions = list[tuple[asyncio.Future, BaseException | None]]


@dataclass(slots=True)
class AddCommand:
    request: NewRequest  # its id and arrival time set
    stream: RequestStream
    admitted: asyncio.Future


@dataclass(slots=True)
class AbortCommand:
    request_id: str
    message: str


@dataclass(slots=True)
class _Live:
    stream: RequestStream
    left: int  # sequences still to end (n of an n > 1 request)


@dataclass(frozen=True, slots=True)
class EngineState(EngineSnapshot):
    """What the engine thread publishes for /health and /metrics: the core's snapshot
    and the steps this loop ran."""

    steps: int = 0

    @classmethod
    def of(cls, snap: EngineSnapshot, steps: int) -> EngineState:
        return cls(**{f.name: getattr(snap, f.name) for f in fields(snap)}, steps=steps)


# ---- the engine thread ----

class EngineLoop:
    """The engine thread: apply the handlers' commands, run a step, hand each output to
    its request's stream, keeping the exactly-once promise on every failure path."""

    def __init__(self, engine: LLMEngine, metrics: ServerMetrics,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        # (outputs, admissions) of one iteration each, for the event loop
        self.outbox: asyncio.Queue[tuple[Outputs, Admissions]] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_fatal = on_fatal
        self._steps = 0
        self.state = EngineState.of(engine.core.snapshot(), 0)
        self.fault: str | None = None
        self.commands: deque[AddCommand | AbortCommand | None] = deque()
        self.wake = threading.Event()
        self._live: dict[str, _Live] = {}  # admitted requests, by their id
        # what this iteration hands over at its end (on self: the fatal path needs them)
        self._outputs: Outputs = []
        self._admissions: Admissions = []

    def run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The thread's body; `loop`: the event loop its outbox posts to."""
        self._loop = loop
        try:
            self._loop_forever()
        except Exception as e:  # the loop cannot go on: answer everyone, then exit
            log.exception("engine loop failed")
            self.fault = f"engine failed: {type(e).__name__}: {e}"
            self._fail_all(self.fault)
            if self.on_fatal is not None:
                self.on_fatal(self.fault)

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            self.wake.clear()
            self._outputs, self._admissions = [], []
            if self._apply_commands():
                for rid in list(self._live):
                    engine.abort_request(rid, "server shutting down")
                self._collect(engine.step())  # nothing left to run: only the ends
                self._publish()
                return
            # Stepped even with nothing to run: the result carries requests that ended
            # without a step (aborts, queue timeouts).
            t0 = time.perf_counter()
            result = engine.step()
            if result.ran:
                self._steps += 1
                self.metrics.on_steps([result.record], time.perf_counter() - t0)
            self._collect(result)
            self._publish()
            if not result.ran:
                timeout = None
                if engine.has_unfinished():
                    wake_at = engine.core.next_wakeup_time()
                    timeout = IDLE_POLL_S if wake_at is None else \
                        min(max(wake_at - engine.clock.now(), 0.0), 0.05)
                self.wake.wait(timeout)

    def _collect(self, step: EngineStep) -> None:
        """Hand each output to its request's stream; count tokens and ends."""
        for req in step.emitted:
            self.metrics.on_token(req)
        self._route(step.outputs)

    def _route(self, outputs: EngineOutputs) -> None:
        for req, out in outputs:
            rid = req.parent_id or req.request_id
            live = self._live.get(rid)
            if live is None:
                continue  # a sibling of a refused one: never admitted
            self._outputs.append((live.stream, out))
            if out.finished:
                live.left -= 1
                if not live.left:
                    del self._live[rid]
                # what the client got is what is counted
                self.metrics.on_finished(req, FinishReason(out.finish_reason),
                                         last=not live.left)

    def _apply_commands(self) -> bool:
        """Apply queued adds and aborts; True when asked to stop."""
        while self.commands:
            cmd = self.commands.popleft()
            if cmd is None:
                return True
            if isinstance(cmd, AbortCommand):
                self.engine.abort_request(cmd.request_id, cmd.message)  # n > 1: all
            else:
                self._admissions.append((cmd.admitted, self._admit(cmd)))
        return False

    def _admit(self, cmd: AddCommand) -> BaseException | None:
        """Hand one request to the engine; the admission error, or None if it was taken."""
        new = cmd.request
        try:
            children = self.engine.add_parallel(new.prompt_ids, new.params, new.request_id,
                                                new.arrival_time, new.streamed,
                                                new.cache_salt)
        except InvalidRequest as e:
            return RequestRejected.of(e)
        except ValueError as e:
            return RequestRejected(str(e))
        except Exception as e:  # not the client's fault, and not queued: a 500 for it alone
            log.exception("admitting request %s failed", new.request_id)
            return RequestFailed(f"{type(e).__name__}: {e}")
        refused = children[0]
        if refused.is_finished:  # refused at admission
            why = refused.reject_reason.value if refused.reject_reason else "invalid"
            return RequestRejected(refused.finish_message, why)
        self._live[new.request_id] = _Live(cmd.stream, len(children))  # n on one stream
        return None

    def _publish(self) -> None:
        self.state = EngineState.of(self.engine.core.snapshot(), self._steps)
        self.metrics.on_state(self.state)
        self._post()

    def _post(self) -> None:
        outputs, admissions = self._outputs, self._admissions
        self._outputs, self._admissions = [], []
        loop = self._loop
        if (outputs or admissions) and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.outbox.put_nowait, (outputs, admissions))

    def _fail_all(self, message: str) -> None:
        """The loop is dead: every live request gets its final error (the engine ends
        them), every admission still pending an answer (taken ones resolve, and then
        their stream ends in error; queued ones are refused)."""
        self._route(self.engine.fail_all(message))
        while self.commands:
            cmd = self.commands.popleft()
            if isinstance(cmd, AddCommand):
                self._admissions.append((cmd.admitted, EngineUnavailable(message)))
        self._post()


# ---- the event loop's side ----

class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        """`on_fatal(reason)`: called on the engine thread once the loop has died and every
        request has been answered (the server exits non-zero)."""
        self.engine = engine
        metrics.watch(engine)
        self.accepting = True
        self._worker = EngineLoop(engine, metrics, on_fatal)
        self._commands, self._wake = self._worker.commands, self._worker.wake
        self._thread: threading.Thread | None = None
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[str, RequestStream] = {}  # event loop only
        self._all_ended = asyncio.Event()
        self._all_ended.set()
        self._drain_cut = asyncio.Event()
        self._ids = itertools.count()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        # the engine thread's OpenMP pool must be the only one (model/omp.py)
        from stepserve.model.omp import release_openmp_pool

        release_openmp_pool()
        self._reader = self._loop.create_task(self._read_outbox())
        self._thread = threading.Thread(target=self._worker.run, args=(self._loop,),
                                        name="stepserve-engine", daemon=True)
        self._thread.start()

    @property
    def state(self) -> EngineState:
        """The engine thread's latest snapshot (for /health and /metrics)."""
        return self._worker.state

    @property
    def fault(self) -> str | None:
        """Why the engine loop died (None while it runs)."""
        return self._worker.fault

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fault is None

    @property
    def num_live(self) -> int:
        return len(self._live)

    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """Stop admitting; let live requests finish for up to `timeout_s`, then abort the
        rest. Returns (finished during the drain, aborted)."""
        self.accepting = False
        return await drain_live(self._live, self._all_ended, self._drain_cut, self.abort,
                                timeout_s)

    def cut_drain(self) -> None:
        """Abort a drain in progress at once (a second shutdown signal). Event loop only."""
        self._drain_cut.set()

    async def stop(self) -> None:
        """End the engine thread (live requests are aborted first)."""
        if self._thread is None:
            return
        self._commands.append(None)
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 30.0)
        self._thread = None
        # the thread's last messages are queued by now (they were posted before the join
        # returned, and calls made thread-safe run in order): deliver them, then stop
        queue = self._worker.outbox
        while not queue.empty():
            self._deliver(*queue.get_nowait())
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    async def add(self, request: NewRequest) -> RequestStream:
        """Submit a request; returns its stream once the scheduler admitted it.
        Raises RequestRejected (queue full, too long, a field the engine cannot take) or
        EngineUnavailable."""
        if not self.accepting or not self.is_running:
            raise EngineUnavailable(self.fault or "the server is shutting down")
        request_id = request.request_id
        if request_id is None:
            request_id = f"srv-{next(self._ids)}"
        assert self._loop is not None
        stream = RequestStream(request_id, len(request.prompt_ids), request.params.n)
        admitted = self._loop.create_future()
        arrival = self.engine.clock.now() if request.arrival_time is None \
            else request.arrival_time
        self._live[request_id] = stream
        self._all_ended.clear()
        self._commands.append(AddCommand(
            replace(request, request_id=request_id, arrival_time=arrival), stream, admitted))
        self._wake.set()
        if self.fault is not None:  # the loop died after the check above and may have
            # drained the queue already: answer here (whoever answers first wins)
            self._deliver([], [(admitted, EngineUnavailable(self.fault))])
        try:
            await admitted
        except BaseException:
            self._forget(request_id)
            # Cancelled while the engine admits it: make sure it does not run unread.
            self._commands.append(AbortCommand(request_id, "cancelled before admission"))
            self._wake.set()
            raise
        return stream

    def abort(self, request_id: str, message: str = "aborted by the client") -> None:
        """Ask the engine to end a request (no-op if it already ended)."""
        if request_id in self._live:
            self._commands.append(AbortCommand(request_id, message))
            self._wake.set()

    def _forget(self, request_id: str) -> None:
        self._live.pop(request_id, None)
        if not self._live:
            self._all_ended.set()

    async def _read_outbox(self) -> None:
        """Event loop: deliver each of the engine thread's messages as it comes."""
        while True:
            outputs, admissions = await self._worker.outbox.get()
            try:
                self._deliver(outputs, admissions)
            except Exception:  # a bug; the next message must still be delivered
                log.exception("delivering the engine's outputs failed")

    def _deliver(self, outputs: Outputs, admissions: Admissions) -> None:
        for fut, err in admissions:
            if fut.done():
                continue
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)
        for stream, out in outputs:
            stream.put(out)  # appends to a slot: nothing here can fail one stream for all
            if out.finished and stream.all_put:
                self._forget(stream.request_id)


async def drain_live(live: Collection[str], all_ended: asyncio.Event,
                     drain_cut: asyncio.Event, abort: Callable[[str, str], None],
                     timeout_s: float) -> tuple[int, int]:
    """Let the requests in `live` finish for up to `timeout_s` (or until `drain_cut` is
    set), then abort the rest and wait for their ends. `live` is the engine's own table
    of live requests, read again after the wait (requests leave it as they end, and
    `all_ended` is set when it empties; the caller has already stopped admitting).
    Returns (finished during the drain, aborted)."""
    before = len(live)
    if before:
        waits = [asyncio.ensure_future(e.wait()) for e in (all_ended, drain_cut)]
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    left = list(live)
    for rid in left:
        abort(rid, f"server shutting down (no finish within the {timeout_s:g} s drain)")
    if left:
        try:
            await asyncio.wait_for(all_ended.wait(), ABORTED_END_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("%d requests did not end after their abort", len(live))
    return before - len(left), len(left)
