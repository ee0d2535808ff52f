"""Shutdown by signal: SIGTERM and SIGINT both drain, log the stop line and exit 0; a
second signal during the drain aborts in-flight requests at once (each answered)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from server_harness import MODEL, serve_process


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_and_exits_zero(sig):
    with serve_process() as server:
        r = httpx.post(server.url + "/v1/completions",
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
        server.proc.send_signal(sig)
        code = server.proc.wait(timeout=30)
        out = server.output()
    assert code == 0, out
    assert "graceful shutdown: 0 in-flight requests finished, 0 aborted" in out
    assert out.rstrip().endswith("stepserve: server stopped"), out


def _long_stream(url: str, lines: list[str], streaming: threading.Event) -> None:
    # 4,000 tokens: still being generated when the signals come, however fast the machine
    # (250 were done within half a second on a quiet one)
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith("data: {"):
                streaming.set()


def _wait_draining(url: str, timeout_s: float = 30.0) -> None:
    """Until /health says the server is shutting down: the drain has begun."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/health", timeout=10).status_code != 503:
        assert time.monotonic() < deadline, "the signal did not start a drain"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_second_signal_cuts_the_drain_short():
    with serve_process("--shutdown-timeout", "120", "--max-model-len", "4096") as server:
        lines: list[str] = []
        streaming = threading.Event()
        reader = threading.Thread(target=_long_stream, args=(server.url, lines, streaming))
        reader.start()
        assert streaming.wait(30), "no token streamed"
        server.proc.send_signal(signal.SIGTERM)
        _wait_draining(server.url)  # it waits for the stream (up to 120 s)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=60)  # well inside the 120 s drain
        reader.join(30)
        out = server.output()
    assert code == 0, out
    assert "second signal" in out
    assert "0 in-flight requests finished, 1 aborted" in out
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "server shutting down" in events[-2]  # the stream was answered, with why


@pytest.mark.slow
def test_a_zero_shutdown_timeout_aborts_a_stream_at_once_and_answers_it():
    """The smallest --shutdown-timeout allowed (nan and negative values are refused at
    startup: test_serve_command.py) ends a stream on the first signal, with why."""
    with serve_process("--shutdown-timeout", "0", "--max-model-len", "4096") as server:
        lines: list[str] = []
        streaming = threading.Event()
        reader = threading.Thread(target=_long_stream, args=(server.url, lines, streaming))
        reader.start()
        assert streaming.wait(30), "no token streamed"
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=60)
        reader.join(60)
        out = server.output()
    assert code == 0, out
    assert "0 in-flight requests finished, 1 aborted" in out
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "server shutting down" in events[-2]
