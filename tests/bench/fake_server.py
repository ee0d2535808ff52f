"""A tiny fake OpenAI-compatible server on 127.0.0.1: streams `tokens` chunks with
`delay_s` between them, answers HTTP 500 to every `fail_every`-th request and breaks
the stream of every `stream_error_every`-th with an SSE error event after one token. No
/metrics (so the bench must do without a scrape)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from server_harness import free_port, wait_until_up


@dataclass
class FakeServer:
    url: str
    settings: dict
    server: uvicorn.Server
    thread: threading.Thread


def make_app(settings: dict) -> FastAPI:
    app = FastAPI()
    count = {"n": 0}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        count["n"] += 1
        every = settings.get("fail_every")
        if every and count["n"] % every == 0:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}},
                                status_code=500)
        n = min(body["max_tokens"], settings.get("tokens", 10**9))
        broken = settings.get("stream_error_every")
        broken = bool(broken) and count["n"] % broken == 0

        async def events():
            for i in range(n):
                await asyncio.sleep(settings.get("delay_s", 0.0))
                if broken and i == 1:
                    err = {"error": {"message": "engine died", "type": "server_error"}}
                    yield f"data: {json.dumps(err)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                chunk = {"choices": [{"index": 0, "text": "x",
                                      "finish_reason": "length" if i == n - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


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
    wait_until_up(url, "/v1/models", timeout_s=30, alive=thread.is_alive)
    try:
        yield FakeServer(url, settings, server, thread)
    finally:
        server.should_exit = True
        thread.join(10)
