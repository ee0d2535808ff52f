"""AsyncEngine: the synchronous LLMEngine's step loop on a background thread, with one
asyncio stream per request.

    HTTP handler --add/abort--> command queue --> engine thread: commands, step(), publish
         ^                                                             |
         +----- RequestStream (merging slot) <-- call_soon_threadsafe --+

Invariants:
* Only the engine thread touches the engine (add, abort, step), so the scheduler is
  never used concurrently. Handlers talk to it through the command queue.
* The thread sleeps on an Event when nothing is unfinished; a command sets the Event.
* An abort is applied before the next step, so its blocks are free one step later.
* Every request ends exactly once: its stream gets one final StreamOutput (finished,
  with a finish reason: stop, length, abort, timed_out) or admission raises
  RequestRejected. A fault in the engine ends every live stream with reason "error".
* Everything the engine thread hands the event loop for one iteration goes in a single
  call_soon_threadsafe (one wake-up of the loop per step, not one per token).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stepserve.request import Request, SamplingParams
from stepserve.server.streams import (
    EngineUnavailable,
    RequestRejected,
    RequestStream,
    StreamOutput,
)

if TYPE_CHECKING:
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.server.metrics import ServerMetrics

log = logging.getLogger("stepserve.server")

IDLE_POLL_S = 0.002  # work is queued but nothing could be scheduled: look again soon


@dataclass(slots=True)
class _Add:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str
    arrival_time: float
    stream: RequestStream
    streamed: bool
    admitted: asyncio.Future


@dataclass(slots=True)
class _Abort:
    request_id: str
    message: str


@dataclass(slots=True)
class _Tracked:
    request: Request
    stream: RequestStream
    streamed: bool
    holdback: int  # characters held back: they might be the start of a stop string
    sent: int = 0  # characters of text already sent


@dataclass
class EngineState:
    """A snapshot the engine thread publishes for /health and /metrics."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_gpu_blocks: int = 0
    num_gpu_blocks_used: int = 0
    kv_usage: float = 0.0
    num_preemptions_total: int = 0
    steps: int = 0
    time: float = field(default_factory=time.monotonic)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.state = EngineState()
        self.fault: str | None = None
        self.accepting = True
        self._commands: deque[_Add | _Abort | None] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._live: dict[str, RequestStream] = {}  # event loop only
        self._all_ended: asyncio.Event | None = None
        self._counter = 0

    # ---- lifecycle (event loop side) ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._all_ended = asyncio.Event()
        self._all_ended.set()
        self._thread = threading.Thread(target=self._run, name="stepserve-engine", daemon=True)
        self._thread.start()

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
        before = set(self._live)
        if before and self._all_ended is not None:
            try:
                await asyncio.wait_for(self._all_ended.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        left = list(self._live)
        for rid in left:
            self.abort(rid, f"server shutting down (no finish within the {timeout_s:g} s "
                            f"drain)")
        if left and self._all_ended is not None:
            try:
                await asyncio.wait_for(self._all_ended.wait(), 10.0)
            except asyncio.TimeoutError:
                log.warning("%d requests did not end after their abort", len(self._live))
        return len(before) - len(left), len(left)

    async def stop(self) -> None:
        """End the engine thread (live requests are aborted first)."""
        if self._thread is None:
            return
        self._commands.append(None)
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 30.0)
        self._thread = None

    # ---- requests (event loop side) ----
    async def add(self, prompt_ids: list[int], params: SamplingParams, *,
                  streamed: bool = True, request_id: str | None = None,
                  arrival_time: float | None = None) -> RequestStream:
        """Submit a request; returns its stream once the scheduler admitted it.
        Raises RequestRejected (queue full, too long) or EngineUnavailable."""
        if not self.accepting or not self.is_running:
            raise EngineUnavailable(self.fault or "the server is shutting down")
        if request_id is None:
            request_id = f"srv-{self._counter}"
            self._counter += 1
        assert self._loop is not None
        stream = RequestStream(request_id, len(prompt_ids))
        admitted = self._loop.create_future()
        arrival = self.engine.clock.now() if arrival_time is None else arrival_time
        self._live[request_id] = stream
        self._all_ended.clear()  # type: ignore[union-attr]
        self._commands.append(_Add(prompt_ids, params, request_id, arrival, stream, streamed,
                                   admitted))
        self._wake.set()
        try:
            await admitted
        except BaseException:
            self._forget(request_id)
            # Cancelled while the engine admits it: make sure it does not run unread.
            self._commands.append(_Abort(request_id, "cancelled before admission"))
            self._wake.set()
            raise
        return stream

    def abort(self, request_id: str, message: str = "aborted by the client") -> None:
        """Ask the engine to end a request (no-op if it already ended)."""
        if request_id in self._live:
            self._commands.append(_Abort(request_id, message))
            self._wake.set()

    def _forget(self, request_id: str) -> None:
        self._live.pop(request_id, None)
        if not self._live and self._all_ended is not None:
            self._all_ended.set()

    def _deliver(self, outputs: list[tuple[RequestStream, StreamOutput]],
                 admissions: list[tuple[asyncio.Future, BaseException | None]]) -> None:
        for fut, err in admissions:
            if fut.done():
                continue
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)
        for stream, out in outputs:
            stream.put(out)
            if out.finished:
                self._forget(stream.request_id)

    # ---- the engine thread ----
    def _run(self) -> None:
        try:
            self._loop_forever()
        except Exception as e:  # a bug or a runtime fault: fail every live request
            log.exception("engine loop failed")
            self.fault = f"engine failed: {type(e).__name__}: {e}"
            self._fail_all(self.fault)

    def _loop_forever(self) -> None:
        engine = self.engine
        sched = engine.scheduler
        while True:
            self._wake.clear()
            outputs: list[tuple[RequestStream, StreamOutput]] = []
            admissions: list[tuple[asyncio.Future, BaseException | None]] = []
            stopping = self._apply_commands(outputs, admissions)
            if stopping:
                for rid in list(self._tracked):
                    sched.abort_request(rid, "server shutting down")
                self._collect_finished(outputs)
                self._publish(outputs, admissions)
                return
            ran = False
            if engine.has_unfinished():
                n_steps = len(sched.step_records)
                t0 = time.perf_counter()
                emitted = engine.step()
                wall_s = time.perf_counter() - t0
                ran = len(sched.step_records) != n_steps
                self.state.steps += ran
                if ran and self.metrics is not None:
                    self.metrics.on_steps(sched.step_records[n_steps:], wall_s)
                del sched.step_records[:]  # consumed: a server must not grow without bound
                self._collect_tokens(emitted, outputs)
            self._collect_finished(outputs)
            self._publish(outputs, admissions)
            if not ran:
                timeout = None
                if engine.has_unfinished():
                    wake_at = sched.next_wakeup_time()
                    timeout = IDLE_POLL_S if wake_at is None else \
                        min(max(wake_at - engine.clock.now(), 0.0), 0.05)
                self._wake.wait(timeout)

    def _apply_commands(self, outputs, admissions) -> bool:
        engine = self.engine
        while self._commands:
            cmd = self._commands.popleft()
            if cmd is None:
                return True
            if isinstance(cmd, _Abort):
                if cmd.request_id in self._tracked:
                    engine.scheduler.abort_request(cmd.request_id, cmd.message)
                continue
            try:
                req = engine.add_request(cmd.prompt_ids, cmd.params, cmd.request_id,
                                         arrival_time=cmd.arrival_time,
                                         stream_text=cmd.streamed)
            except ValueError as e:
                admissions.append((cmd.admitted, RequestRejected(str(e))))
                continue
            if req.is_finished:
                engine.release([req])
                why = req.reject_reason.value if req.reject_reason else "invalid"
                admissions.append((cmd.admitted, RequestRejected(req.finish_message, why)))
                continue
            stops = cmd.params.stop
            holdback = max((len(s) for s in stops), default=1) - 1
            self._tracked[req.request_id] = _Tracked(req, cmd.stream, cmd.streamed, holdback)
            admissions.append((cmd.admitted, None))
        return False

    def _collect_tokens(self, emitted: list[Request], outputs) -> None:
        text_of = self.engine.text_of
        metrics = self.metrics
        for req in emitted:
            if metrics is not None and req.num_output_tokens == 1:
                metrics.on_first_token(req)
            t = self._tracked.get(req.request_id)
            if t is None or not t.streamed or req.is_finished:
                continue  # finished ones are reported by _collect_finished
            text = ""
            full = text_of(req)
            end = len(full) - t.holdback
            if end > t.sent:
                text = full[t.sent:end]
                t.sent = end
            outputs.append((t.stream, StreamOutput(text, req.num_prompt_tokens,
                                                   req.num_output_tokens)))

    def _collect_finished(self, outputs) -> None:
        sched = self.engine.scheduler
        if not sched.finished:
            return
        ended = []
        for req in sched.finished:
            t = self._tracked.pop(req.request_id, None)
            if t is None:
                continue  # rejected at admission: answered there
            ended.append(req)
            full = self._final_text(req, t.streamed)
            reason = req.finish_reason.value if req.finish_reason else "error"
            outputs.append((t.stream, StreamOutput(
                full[t.sent:] if t.streamed else "", req.num_prompt_tokens,
                req.num_output_tokens, True, reason, req.finish_message, full)))
            if self.metrics is not None:
                self.metrics.on_finished(req)
        del sched.finished[:]  # consumed: a server must not grow without bound
        self.engine.release(ended)

    def _final_text(self, req: Request, streamed: bool) -> str:
        """The whole completion, as the offline LLM.generate returns it. A streamed one
        must extend what was sent (the incremental detokenizer's text); it differs from
        a plain decode only by bytes still held back at the end (an unfinished
        character), which the plain decode shows."""
        plain = self.engine.tokenizer.decode(req.output_token_ids)
        if not streamed and not req.sampling_params.stop:
            return plain  # what text_of gives when there is no detokenizer
        text = self.engine.text_of(req)
        if req.sampling_params.stop:
            return text
        return plain if not streamed or plain.startswith(text) else text

    def _publish(self, outputs, admissions) -> None:
        sched = self.engine.scheduler
        kv = sched.kv
        used = kv.num_gpu_blocks - kv.num_free_blocks
        self.state = EngineState(len(sched.running), len(sched.waiting), len(sched.swapped),
                                 kv.num_gpu_blocks, used, kv.usage,
                                 sched.num_preemptions_total, self.state.steps)
        if self.metrics is not None:
            self.metrics.on_state(self.state)
        if (outputs or admissions) and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, outputs, admissions)

    def _fail_all(self, message: str) -> None:
        outputs = []
        for t in self._tracked.values():
            req = t.request
            outputs.append((t.stream, StreamOutput("", req.num_prompt_tokens,
                                                   req.num_output_tokens, True, "error",
                                                   message, "")))
        self._tracked.clear()
        admissions = []
        while self._commands:
            cmd = self._commands.popleft()
            if isinstance(cmd, _Add):
                admissions.append((cmd.admitted, EngineUnavailable(message)))
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, outputs, admissions)

