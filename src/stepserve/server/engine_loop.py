"""The engine thread of the server: apply the handlers' commands, run a step, turn its
results into per-request outputs, hand them to the event loop; and keep the exactly-once
promise of async_engine.py on every failure path."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stepserve.core.end_reasons import FinishReason
from stepserve.core.snapshot import EngineSnapshot
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
    from stepserve.engine.output_processor import Outputs as EngineOutputs
    from stepserve.server.metrics import ServerMetrics

log = logging.getLogger("stepserve.server")

IDLE_POLL_S = 0.002  # work is queued but nothing could be scheduled: look again soon

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


@dataclass
class EngineState:
    """What the engine thread publishes for /health and /metrics: the core's snapshot
    and the steps this loop ran."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_gpu_blocks: int = 0
    num_gpu_blocks_used: int = 0
    kv_usage: float = 0.0
    num_preemptions_total: int = 0
    steps: int = 0
    time: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, snap: EngineSnapshot, steps: int) -> EngineState:
        return cls(snap.num_running, snap.num_waiting, snap.num_swapped, snap.num_gpu_blocks,
                   snap.num_gpu_blocks_used, snap.kv_usage, snap.num_preemptions_total, steps)


class Outbox:
    """The engine thread's messages to the event loop, each (outputs, admissions) of one
    iteration: one call_soon_threadsafe onto a queue the event loop reads."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[tuple[Outputs, Admissions]] | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the event loop, before the engine thread starts."""
        self._loop, self.queue = loop, asyncio.Queue()

    def post(self, outputs: Outputs, admissions: Admissions) -> None:
        """Engine thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.queue.put_nowait, (outputs, admissions))


class EngineLoop:
    """Runs on the engine thread only (`run`); the event loop talks to it through
    `commands` and `wake`, and hears from it through `outbox`: neither calls the
    other."""

    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.outbox = Outbox()
        self.on_fatal = on_fatal
        self.state = EngineState()
        self.fault: str | None = None
        self.commands: deque[AddCommand | AbortCommand | None] = deque()
        self.wake = threading.Event()
        self._live: dict[str, _Live] = {}  # admitted requests, by their id
        # what this iteration hands over at its end (on self: the fatal path needs them)
        self._outputs: Outputs = []
        self._admissions: Admissions = []

    def run(self) -> None:
        """The thread's body."""
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
                self.state.steps += 1
                if self.metrics is not None:
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
        if self.metrics is not None:
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
                if self.metrics is not None:  # what the client got is what is counted
                    self.metrics.on_finished(req, FinishReason(out.finish_reason))

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
        self.state = EngineState.of(self.engine.core.snapshot(), self.state.steps)
        if self.metrics is not None:
            self.metrics.on_state(self.state)
        self._post()

    def _post(self) -> None:
        outputs, admissions = self._outputs, self._admissions
        self._outputs, self._admissions = [], []
        if outputs or admissions:
            self.outbox.post(outputs, admissions)

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
