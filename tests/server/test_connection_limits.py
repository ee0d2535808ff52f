"""What one connection may hold of the server (server/connection_limits.py), over raw
sockets: a head over --max-header-bytes gets 431 before
the API key is looked at, a stalled head or body 408 after --header-timeout or
--body-timeout, a connection that sends nothing is closed, a stream outlives every
timeout, and past --max-connections an idle connection makes room or, when all are busy,
the new one gets 503 and is closed. Each test waits on what the server does (a socket
read with a generous timeout, the server's own connection table), never on a clock."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from server_harness import MODEL, Served, free_port, make_engine, serve_process, wait_until_up

from stepserve.server.api import create_app
from stepserve.server.connection_limits import ConnectionLimits
from stepserve.server.http_server import make_server

KEY = "sesame"
WAIT_S = 60.0  # a socket read's timeout: far past any limit the tests set


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def read_to_close(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset after its
    answer, as when it stops reading a client that is still sending, ends it too)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        if not out:
            raise
    return out


def read_answer(s: socket.socket) -> bytes:
    """One answer with a content-length, on a connection that stays open."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += s.recv(65536)
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), answer[:300]
    return int(head.split()[1]), json.loads(body)["error"]


@pytest.fixture(scope="module")
def strict():
    """`stepserve serve` with one-second head and body timeouts and an API key."""
    with serve_process("--header-timeout", "1", "--body-timeout", "1", "--api-key", KEY) \
            as server:
        yield server


def test_a_huge_head_gets_431_before_the_api_key(strict):
    for path in ("/v1/models", "/health"):  # behind the key, and public
        s = connect(strict.url)
        # 16 MB of one header, sent on a thread: the server answers long before the end
        sender = threading.Thread(target=_send_quietly, args=(
            s, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Big: "
            + b"a" * 16_000_000 + b"\r\n\r\n"))
        sender.start()
        status, error = status_and_error(read_to_close(s))
        sender.join(WAIT_S)
        s.close()
        assert (status, error["code"]) == (431, "headers_too_large"), error
        assert "--max-header-bytes" in error["message"]
    assert httpx.get(strict.url + "/health").status_code == 200


def _send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:  # the server closed: it had read enough to answer
        pass


@pytest.mark.parametrize("extra, status", [(0, 200), (1, 431)], ids=["at", "over"])
def test_the_head_limit_is_exact(strict, extra, status):
    start = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
    pad = 64 * 1024 - len(start) - 4 + extra  # the head ends with \r\n\r\n
    s = connect(strict.url)
    s.sendall(start + b"p" * pad + b"\r\n\r\n")
    answer = read_to_close(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 %d" % status), answer[:200]


@pytest.mark.parametrize("dribble", [False, True], ids=["stalled", "dribbled"])
def test_a_head_that_does_not_finish_in_time_gets_408(strict, dribble):
    s = connect(strict.url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    done = threading.Event()
    if dribble:  # a byte every 50 ms: a slowloris, never silent long enough to stall
        threading.Thread(target=_dribble, args=(s, done)).start()
    try:
        status, error = status_and_error(read_to_close(s))
    finally:
        done.set()
        s.close()
    assert (status, error["code"]) == (408, "request_timeout"), error
    assert "--header-timeout" in error["message"]


def _dribble(s: socket.socket, done: threading.Event) -> None:
    while not done.wait(0.05):
        _send_quietly(s, b"x")


def test_a_stalled_body_gets_408_and_the_server_goes_on(strict):
    s = connect(strict.url)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"model\": ")
    status, error = status_and_error(read_to_close(s))
    s.close()
    assert (status, error["code"]) == (408, "request_timeout"), error
    assert "10 bytes came" in error["message"] and "--body-timeout" in error["message"]
    r = httpx.post(strict.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_a_body_dribbled_a_byte_at_a_time_gets_408(strict):
    """Never silent for a second, but far under the least rate a body must keep."""
    s = connect(strict.url)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000\r\n\r\n")
    done = threading.Event()
    threading.Thread(target=_dribble, args=(s, done)).start()
    try:
        status, error = status_and_error(read_to_close(s))
    finally:
        done.set()
        s.close()
    assert (status, error["code"]) == (408, "request_timeout"), error
    assert "KiB/s" in error["message"], error


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(strict):
    s = connect(strict.url)
    assert read_to_close(s) == b""
    s.close()


# ---- servers in this process: their engine and connection table in view ----

@contextmanager
def server_with(limits: ConnectionLimits) -> Iterator[Served]:
    app = create_app(make_engine(max_model_len=4096), model_name=MODEL)
    port = free_port()
    server = make_server(app, "127.0.0.1", port, log_level="warning", limits=limits)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, alive=thread.is_alive)
    served = Served(url, app, server, thread)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def brisk():
    """Half-second head and body timeouts; kept-alive connections kept for minutes."""
    limits = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5,
                              keep_alive_timeout_s=600)
    with server_with(limits) as served:
        yield served


def half_a_second_passed(url: str) -> None:
    """A head begun now and never finished gets its 408 once the header timeout is up:
    the server's own clock, read without a sleep."""
    sentinel = connect(url)
    sentinel.sendall(b"GET /health HTTP/1.1\r\n")
    assert read_to_close(sentinel).startswith(b"HTTP/1.1 408")
    sentinel.close()


def test_a_stream_outlives_the_timeouts(brisk):
    """Timeouts bound receiving a request, never sending its answer: a stream goes on
    after a stalled head that began with it has had its 408."""
    # 2,000 tokens: seconds of stream (250 took 0.5 s on a quiet machine); it is cut
    # (a disconnect) once it has shown it goes on
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=WAIT_S) as client:
        with client.stream("POST", brisk.url + "/v1/completions", json=body) as r:
            events = (line for line in r.iter_lines() if line)
            assert next(events).startswith("data: {")
            half_a_second_passed(brisk.url)
            assert brisk.app.state.async_engine.num_live == 1  # still generating
            assert all(next(events).startswith("data: {") for _ in range(10))
    brisk.wait_idle()


def test_a_kept_alive_connection_waits_for_its_next_request(brisk):
    """Between requests the keep-alive timeout applies, not the header timeout; the
    next request's head is timed from its first byte."""
    s = connect(brisk.url)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):
        s.sendall(request)
        assert read_answer(s).startswith(b"HTTP/1.1 200")
        half_a_second_passed(brisk.url)  # longer than the header timeout: still open
    s.sendall(request[:20])
    answer = read_to_close(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


@pytest.fixture(scope="module")
def capped():
    """At most four connections; timeouts far longer than any test."""
    limits = ConnectionLimits(max_connections=4, header_timeout_s=600, body_timeout_s=600)
    with server_with(limits) as served:
        yield served


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def connections(served: Served) -> int:
    return len(served.server.server_state.connections)


def idle_connections(served: Served) -> int:
    return served.server.config.http_protocol_class.table.num_idle


def health(url: str) -> bytes:
    s = connect(url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = read_to_close(s)
    s.close()
    return answer


def test_health_answers_while_idle_connections_fill_the_cap(capped):
    wait_for(lambda: connections(capped) == 0, "the server's connections closed")
    idle = [connect(capped.url) for _ in range(4)]
    wait_for(lambda: idle_connections(capped) == 4, "four idle connections held")
    assert health(capped.url).startswith(b"HTTP/1.1 200")
    assert read_to_close(idle[0]) == b""  # the longest idle made room
    for s in idle:
        s.close()


def test_past_the_cap_of_busy_connections_a_new_one_gets_503_and_is_closed(capped):
    wait_for(lambda: connections(capped) == 0, "the server's connections closed")
    busy = [connect(capped.url) for _ in range(4)]
    for s in busy:
        s.sendall(b"GET /health HTTP/1.1\r\n")  # a head begun: a request in progress
    wait_for(lambda: connections(capped) == 4 and idle_connections(capped) == 0,
             "four busy connections held")
    status, error = status_and_error(read_to_close(connect(capped.url)))
    assert (status, error["code"]) == (503, "too_many_connections"), error
    assert connections(capped) == 4  # the refused one holds nothing
    busy.pop().close()
    wait_for(lambda: connections(capped) == 3, "a busy connection gone")
    assert health(capped.url).startswith(b"HTTP/1.1 200")
    for s in busy:
        s.close()
