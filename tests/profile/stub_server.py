"""A stand-in OpenAI-compatible server without /metrics (as a llama.cpp server started
without --metrics is): /v1/models, and /v1/completions streaming one SSE event per token
with a usage chunk. `slots` requests decode at once; the rest wait for a slot before
their prefill, so the only evidence of the slot count is the client's timings."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFILL_S = 0.01  # before a request's first token: a late reader would need this long
TOKEN_S = 0.001


def _handler(slots: threading.Semaphore, api_key: str | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _refused(self) -> bool:
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._json(401, {"error": {"message": "bad key"}})
                return True
            return False

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self._refused():
                return
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "stub",
                                                             "max_model_len": 256}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self._refused():
                return
            prompt, n = body["prompt"], int(body["max_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with slots:
                time.sleep(PREFILL_S)
                for i in range(n):
                    if i:
                        time.sleep(TOKEN_S)
                    last = i == n - 1
                    self._event({"choices": [{"index": 0, "text": "x", "finish_reason":
                                              "length" if last else None}]})
            self._event({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                                  "completion_tokens": n}})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")

        def _event(self, event: dict) -> None:
            self._chunk(f"data: {json.dumps(event)}\n\n".encode())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


@contextmanager
def stub_server(slots: int = 2, api_key: str | None = None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(threading.Semaphore(slots),
                                                            api_key))
    server.daemon_threads = True
    server.handle_error = lambda *args: None  # a client closing a kept-alive connection
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
