"""A tiny fake OpenAI-compatible server on 127.0.0.1: streams `tokens` chunks with
`delay_s` between them, answers HTTP 500 to every `fail_every`-th request and breaks
the stream of every `stream_error_every`-th with an SSE error event after one token.
`/v1/chat/completions` streams deltas the same way. With `api_key`, anything without
`Authorization: Bearer <api_key>` gets 401. Every generation request's body and headers
are kept in `settings["seen"]`. No /metrics (so the bench must do without a scrape).

Hooks for tests that act at a defined point of a run (they run on the server's thread):
`on_models()` when GET /v1/models arrives, `on_answered(n)` when the n-th stream has
been sent whole, and `hold_until()`: a stream sends nothing until it is true (a run's
shape made certain by events, not by `delay_s` being long enough; after HOLD_S the
stream goes on, and the test's own assertion says what never happened)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from server_harness import free_port, wait_until_up

HOLD_S = 60.0


@dataclass
class FakeServer:
    url: str
    settings: dict
    server: uvicorn.Server
    thread: threading.Thread


def make_app(settings: dict) -> FastAPI:
    app = FastAPI()
    count = {"n": 0, "answered": 0}
    settings.setdefault("seen", [])

    def refused(request: Request) -> JSONResponse | None:
        key = settings.get("api_key")
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        return None

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models(request: Request):
        if (hook := settings.get("on_models")) is not None:
            hook()
        return refused(request) or \
            {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await completions(request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        if (no := refused(request)) is not None:
            return no
        body = await request.json()
        settings["seen"].append((request.url.path, dict(request.headers), body))
        chat = request.url.path.endswith("chat/completions")
        count["n"] += 1
        every = settings.get("fail_every")
        if every and count["n"] % every == 0:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}},
                                status_code=500)
        n = min(body["max_completion_tokens" if chat else "max_tokens"],
                settings.get("tokens", 10**9))
        broken = settings.get("stream_error_every")
        broken = bool(broken) and count["n"] % broken == 0

        async def events():
            if (hold := settings.get("hold_until")) is not None:
                await held(hold)
            for i in range(n):
                await asyncio.sleep(settings.get("delay_s", 0.0))
                if broken and i == 1:
                    err = {"error": {"message": "engine died", "type": "server_error"}}
                    yield f"data: {json.dumps(err)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                end = "length" if i == n - 1 else None
                choice = {"index": 0, "delta": {"content": "x"}} if chat else \
                    {"index": 0, "text": "x"}
                chunk = {"choices": [{**choice, "finish_reason": end}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            count["answered"] += 1
            if (hook := settings.get("on_answered")) is not None:
                hook(count["answered"])

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def held(ready: Callable[[], bool]) -> None:
    """Until `ready()` (checked as the server's loop goes on), HOLD_S at most."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HOLD_S
    while not ready() and loop.time() < deadline:
        await asyncio.sleep(0.005)


@contextmanager
def run_fake(**settings) -> Iterator[FakeServer]:
    settings = {"delay_s": 0.001, **settings}
    port = free_port()
    config = uvicorn.Config(make_app(settings), host="127.0.0.1", port=port,
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, "/health", timeout_s=30, alive=thread.is_alive)
    try:
        yield FakeServer(url, settings, server, thread)
    finally:
        server.should_exit = True
        thread.join(10)
