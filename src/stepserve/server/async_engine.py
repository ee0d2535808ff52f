"""AsyncEngine: the synchronous LLMEngine's step loop on a background thread, with one
asyncio stream per request.

    HTTP handler --add/abort--> command queue --> engine thread: commands, step(), publish
         ^                                                             |
         +----- RequestStream (merging slot) <-- outbox (a queue) -----+

Invariants:
* Only the engine thread touches the engine (add, abort, step), so the scheduler is
  never used concurrently. Handlers talk to it through the command queue.
* The thread sleeps on an Event when nothing is unfinished; a command sets the Event.
* An abort is applied before the next step, so its blocks are free one step later.
* Exactly one answer per accepted request. Admission either raises (RequestRejected,
  EngineUnavailable) or returns a stream that gets exactly one final StreamOutput
  (finished, with a reason: stop, length, abort, timed_out, error). Every path keeps it:
  - a fault while a step runs ends that step's requests with "error" (LLMEngine.step);
  - a fault while turning one request's tokens into text ends that request with "error";
  - a fault of the loop itself (the scheduler, a dead runner) answers every tracked
    request with "error", resolves every admission still pending (including those
    accepted in the failing iteration, kept on `self` for that reason), refuses queued
    ones, and calls `on_fatal` so the server exits non-zero for a supervisor to restart.
* Everything the engine thread hands the event loop for one iteration is one message on
  its outbox (one call_soon_threadsafe: one wake-up of the loop per step, not one per
  token). Calls go one way: this side calls nothing of the engine thread's but its
  command queue and wake-up event, and the engine thread calls nothing of this side.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from stepserve.engine.seam import EngineUnavailable, NewRequest, RequestStream
from stepserve.server.drain import drain_live
from stepserve.server.engine_loop import (
    AbortCommand,
    AddCommand,
    Admissions,
    EngineLoop,
    EngineState,
    Outputs,
)

if TYPE_CHECKING:
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.server.metrics import ServerMetrics

log = logging.getLogger("stepserve.server")


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        """`on_fatal(reason)`: called on the engine thread once the loop has died and every
        request has been answered (the server exits non-zero)."""
        self.engine = engine
        self.metrics = metrics
        if metrics is not None:
            metrics.cache.watch(engine.core)
            if (threads := getattr(engine, "step_threads", None)) is not None:
                metrics.cpu.watch(threads)
        self.accepting = True
        self._worker = EngineLoop(engine, metrics, on_fatal)
        self._commands = self._worker.commands
        self._wake = self._worker.wake
        self._outbox = self._worker.outbox
        self._thread: threading.Thread | None = None
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[str, RequestStream] = {}  # event loop only
        self._all_ended: asyncio.Event | None = None
        self._drain_cut: asyncio.Event | None = None
        self._counter = 0

    # ---- lifecycle (event loop side) ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._all_ended = asyncio.Event()
        self._all_ended.set()
        self._drain_cut = asyncio.Event()
        # the engine thread's OpenMP pool must be the only one (model/omp.py)
        from stepserve.model.omp import release_openmp_pool

        release_openmp_pool()
        self._outbox.open(self._loop)
        self._reader = self._loop.create_task(self._read_outbox())
        self._thread = threading.Thread(target=self._worker.run, name="stepserve-engine",
                                        daemon=True)
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
        if self._all_ended is None or self._drain_cut is None:
            return 0, 0  # never started: nothing is live
        return await drain_live(self._live, self._all_ended, self._drain_cut, self.abort,
                                timeout_s)

    def cut_drain(self) -> None:
        """Abort a drain in progress at once (a second shutdown signal). Event loop only."""
        if self._drain_cut is not None:
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
        queue = self._outbox.queue
        while queue is not None and not queue.empty():
            self._deliver(*queue.get_nowait())
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    # ---- requests (event loop side) ----
    async def add(self, request: NewRequest) -> RequestStream:
        """Submit a request; returns its stream once the scheduler admitted it.
        Raises RequestRejected (queue full, too long, a field the engine cannot take) or
        EngineUnavailable."""
        if not self.accepting or not self.is_running:
            raise EngineUnavailable(self.fault or "the server is shutting down")
        request_id = request.request_id
        if request_id is None:
            request_id = f"srv-{self._counter}"
            self._counter += 1
        assert self._loop is not None
        stream = RequestStream(request_id, len(request.prompt_ids), request.params.n)
        admitted = self._loop.create_future()
        arrival = self.engine.clock.now() if request.arrival_time is None \
            else request.arrival_time
        self._live[request_id] = stream
        self._all_ended.clear()  # type: ignore[union-attr]
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
        if not self._live and self._all_ended is not None:
            self._all_ended.set()

    async def _read_outbox(self) -> None:
        """Event loop: deliver each of the engine thread's messages as it comes."""
        queue = self._outbox.queue
        assert queue is not None
        while True:
            outputs, admissions = await queue.get()
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

