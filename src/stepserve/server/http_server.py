"""uvicorn with a graceful shutdown that knows about the engine.

On SIGINT/SIGTERM (or `should_exit`), before uvicorn closes its listeners: stop admitting
(new requests get 503 "shutting down"), give in-flight requests `shutdown_timeout_s` to
finish, abort the rest (a stream gets an SSE error event saying so, then [DONE]; an
unstreamed request a 503), and log how many finished and how many were aborted.
"""

from __future__ import annotations

import logging
import socket

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("stepserve.server")


class StepServeServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.stepserve_app = app
        self.drain_result: tuple[int, int] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = self.stepserve_app.state
        engine = getattr(state, "async_engine", None)
        if engine is not None:
            timeout = state.shutdown_timeout_s
            live = engine.num_live
            if live:
                log.warning("graceful shutdown: %d requests in flight; waiting up to %g s",
                            live, timeout)
            finished, aborted = await engine.drain(timeout)
            self.drain_result = (finished, aborted)
            log.warning("graceful shutdown: %d in-flight requests finished, %d aborted",
                        finished, aborted)
        await super().shutdown(sockets)


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "info", **config_kwargs) -> StepServeServer:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5, **config_kwargs)
    return StepServeServer(config, app)
