"""uvicorn with a graceful shutdown that knows about the engine.

On SIGINT or SIGTERM, before uvicorn closes its listeners: stop admitting (503 "shutting
down"), give in-flight requests `shutdown_timeout_s`, abort the rest, and log how many
finished and were aborted; a second signal aborts them at once. Both signals exit 0
(uvicorn's re-raise of the signal, which would exit 143, is dropped). If the engine loop
dies, `request_exit()` shuts down the same way with `exit_code` 1. Every connection is
bounded by `ConnectionLimits` (connection_limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from stepserve.server.connection_limits import (
    ConnectionLimits,
    fit_to_descriptors,
    guarded_protocol,
)

log = logging.getLogger("stepserve.server")


class StepServeServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.stepserve_app = app
        self.drain_result: tuple[int, int] | None = None
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        app.state.request_exit = self.request_exit

    def request_exit(self) -> None:
        """From any thread: the engine died; shut down and exit non-zero."""
        self.exit_code = 1
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not appended to _captured_signals: nothing is re-raised after the shutdown.
        if not self.should_exit:
            self.should_exit = True
            return
        self.force_exit = True  # a second signal: cut the drain short
        engine = getattr(self.stepserve_app.state, "async_engine", None)
        if engine is not None and self._loop is not None:
            log.warning("second signal: aborting in-flight requests now")
            self._loop.call_soon_threadsafe(engine.cut_drain)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = self.stepserve_app.state
        engine = getattr(state, "async_engine", None)
        if engine is not None:
            if engine.num_live:
                log.warning("graceful shutdown: %d requests in flight; waiting up to %g s",
                            engine.num_live, state.shutdown_timeout_s)
            self.drain_result = await engine.drain(state.shutdown_timeout_s)
            log.warning("graceful shutdown: %d in-flight requests finished, %d aborted",
                        *self.drain_result)
        await super().shutdown(sockets)


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "info", limits: ConnectionLimits | None = None,
                **config_kwargs) -> StepServeServer:
    """The server for `app`; `limits` (default: ConnectionLimits()) bound every
    connection, the connection cap fitted to the open-file limit (raised to its hard
    value here; a cap that cannot fit is a UsageError)."""
    limits = fit_to_descriptors(limits or ConnectionLimits())
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            http=guarded_protocol(limits),
                            timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=5, **config_kwargs)
    return StepServeServer(config, app)
