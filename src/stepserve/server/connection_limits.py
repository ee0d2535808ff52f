"""What one connection may hold of the server (`ConnectionLimits`), and uvicorn's
httptools protocol that enforces it below any app code (before the API key is read).

Unbounded, one client stops every other (a 100 MB header held the event loop 12-17 s;
a dribbled head or a body never sent held a connection forever; 20,000 idle connections
took every descriptor). The defaults, beside other servers' (FLAGS has each flag):
* request head 64 KiB, counted as it arrives (Node 16 KiB, nginx 4 x 8 KiB): else 431;
* head within 10 s of the connection or of its first byte (Node 60 s, Apache 20-40 s):
  else 408, or a silent close when not a byte came;
* body: 408 after 30 s without a byte, or once it falls behind BODY_MIN_BYTES_PER_S after
  that grace (Apache's RequestReadTimeout body=20,MinRate=500);
* idle keep-alive 5 s (uvicorn's, vLLM's and Node's default);
* 2,048 connections, never more than the open-file limit less FD_RESERVE; at the cap a
  new one displaces the longest-idle one, or gets 503 when every one is busy.

The clocks run only while the server waits on the client. A refusal is sent in OpenAI's
error shape with `connection: close`, then input is dropped for up to LINGER_S (or
LINGER_BYTES) before the close, so the client reads the status, not a reset.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import http
import json
import logging
import math
import resource
import struct
import termios
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stepserve.config.errors import UsageError
from stepserve.config.limits import (
    MAX_CONCURRENCY,
    MAX_HEADER_BYTES,
    SECONDS,
    WAIT_SECONDS,
    Range,
)
from stepserve.server.errors import INVALID_REQUEST, UNAVAILABLE, APIError

log = logging.getLogger("stepserve.server")

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 2048
# Descriptors kept for the process's own files: the model, logs, pipes, the event loop's
# own, /proc reads for the metrics, and the connections accepted only to be refused.
FD_RESERVE = 256
# After the body's first `body_timeout_s`, it must have come at this average rate (a
# 4 MiB body then has 256 s more): any real link is far faster, a slow-body attack not.
BODY_MIN_BYTES_PER_S = 16 * 1024


@dataclass(frozen=True)
class LimitFlag:
    """How one limit reads on `stepserve serve`'s command line."""

    flag: str
    allowed: Range
    metavar: str
    help: str


FLAGS = {  # ConnectionLimits field -> its flag
    "max_header_bytes": LimitFlag(
        "--max-header-bytes", Range(1024, MAX_HEADER_BYTES), "N",
        "largest request head (request line and headers); larger ones get 431 before "
        f"anything reads them (default {DEFAULT_MAX_HEADER_BYTES})"),
    "header_timeout_s": LimitFlag(
        "--header-timeout", SECONDS, "S",
        "the whole request head must arrive within this many seconds of the connection "
        "(on a kept-alive one, of its first byte), else 408 (default "
        f"{DEFAULT_HEADER_TIMEOUT_S:g})"),
    "body_timeout_s": LimitFlag(
        "--body-timeout", SECONDS, "S",
        "a request body that stalls this long, or falls behind "
        f"{BODY_MIN_BYTES_PER_S // 1024} KiB/s after it, gets 408 (default "
        f"{DEFAULT_BODY_TIMEOUT_S:g})"),
    "keep_alive_timeout_s": LimitFlag(
        "--timeout-keep-alive", WAIT_SECONDS, "S",
        "close a kept-alive connection idle this long (uvicorn's flag; default "
        f"{DEFAULT_KEEP_ALIVE_TIMEOUT_S:g})"),
    "max_connections": LimitFlag(
        "--max-connections", Range(1, MAX_CONCURRENCY), "N",
        "most connections at once: past it a new one displaces an idle one, or gets 503 "
        f"(default {DEFAULT_MAX_CONNECTIONS}, or what the open-file limit allows)"),
}


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits on each connection (see the module's docstring for the defaults)."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    # None: DEFAULT_MAX_CONNECTIONS, lowered to what the open-file limit allows
    max_connections: int | None = None

    def __post_init__(self) -> None:
        for name, spec in FLAGS.items():
            value = getattr(self, name)
            if value is not None:
                spec.allowed.check(spec.flag, value)

    @property
    def connection_cap(self) -> int:
        """The cap in force (see `fit_to_descriptors`)."""
        return self.max_connections or DEFAULT_MAX_CONNECTIONS


def open_file_limit() -> int:
    """How many files this process may open, its soft limit first raised to the hard
    one (a server needs one descriptor per connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. an unlimited hard limit the OS caps lower
            pass
    return math.inf if soft == resource.RLIM_INFINITY else soft  # type: ignore[return-value]


def fit_to_descriptors(limits: ConnectionLimits) -> ConnectionLimits:
    """`limits` with the connection cap settled: the default lowered to what the
    open-file limit allows (said in a warning), a cap given that does not fit refused
    (UsageError) rather than left to fail with every descriptor taken."""
    files = open_file_limit()
    fits = files - FD_RESERVE
    if limits.max_connections is None:
        if fits < 1:
            raise UsageError(f"this process may open only {files} files (`ulimit -n`); "
                             f"the server keeps {FD_RESERVE} for itself and needs more "
                             "for connections")
        if fits < DEFAULT_MAX_CONNECTIONS:
            log.warning("at most %d connections: this process may open %d files "
                        "(`ulimit -n`) and keeps %d for itself", fits, files, FD_RESERVE)
        return replace(limits, max_connections=int(min(fits, DEFAULT_MAX_CONNECTIONS)))
    if limits.max_connections > fits:
        raise UsageError(f"--max-connections = {limits.max_connections}: this process may "
                         f"open {files} files (`ulimit -n`) and keeps {FD_RESERVE} for "
                         f"itself, so at most {max(fits, 0)} connections fit; raise the "
                         "limit or lower the cap")
    return limits


LINGER_S = 2.0
LINGER_BYTES = 1 << 20
# A deadline that passes with the client's bytes already waiting in the socket was the
# event loop's lateness (libuv runs due timers before it reads): look again this much later.
LATE_LOOP_S = 0.01
END_OF_HEAD = b"\r\n\r\n"  # llhttp takes no bare-LF heads
REFUSALS_WARN_EVERY_S = 10.0


class ConnectionTable:
    """A server's connections that hold no request (none begun, no answer going out),
    longest idle first, and the connections refused since the last warning."""

    def __init__(self) -> None:
        self._idle: dict[GuardedHttpToolsProtocol, None] = {}  # insertion order
        self._refused = 0
        self._warned_at = float("-inf")

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def idle(self, conn: GuardedHttpToolsProtocol) -> None:
        self._idle.pop(conn, None)
        self._idle[conn] = None

    def busy(self, conn: GuardedHttpToolsProtocol) -> None:
        self._idle.pop(conn, None)

    def close_oldest_idle(self) -> bool:
        """Close the longest-idle connection, if there is one."""
        if not self._idle:
            return False
        conn = next(iter(self._idle))
        del self._idle[conn]
        conn.transport.close()
        return True

    def note_refused(self, now: float, cap: int) -> None:
        self._refused += 1
        if now - self._warned_at >= REFUSALS_WARN_EVERY_S:
            log.warning("%d connections refused (503): all %d connections busy with a "
                        "request", self._refused, cap)
            self._refused, self._warned_at = 0, now


class Phase(enum.Enum):
    HEAD = "waiting for a request head"
    BODY = "reading a request body"
    LINGER = "refused: dropping input until the close"


def error_response(status: int, message: str, kind: str, code: str,
                   headers: list[tuple[bytes, bytes]]) -> bytes:
    body = json.dumps(APIError(status, message, kind, code=code).body()).encode()
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
    for name, value in [*headers, (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")]:
        lines += [name, b": ", value, b"\r\n"]
    return b"".join([*lines, b"\r\n", body])


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One connection. Its server's limits and table are class attributes: uvicorn builds
    the protocol from its class (`guarded_protocol` makes one class per server)."""

    limits: ClassVar[ConnectionLimits]
    table: ClassVar[ConnectionTable]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = Phase.HEAD
        self._since = 0.0  # when the phase's clock started
        self._head_bytes = 0
        self._tail = b""  # the head's last 3 bytes so far: END_OF_HEAD may straddle reads
        self._body_bytes = 0
        self._last_byte = 0.0
        self._dropped = 0  # bytes read and dropped while lingering
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cap = self.limits.connection_cap
        if len(self.connections) >= cap and not self.table.close_oldest_idle():
            self._refused = True
            self.table.note_refused(self.loop.time(), cap)
            transport.write(error_response(
                503, f"the server holds its maximum of {cap} connections, each busy with "
                     "a request; try again shortly", UNAVAILABLE, "too_many_connections",
                [*self.server_state.default_headers, (b"retry-after", b"1")]))
            transport.close()
            return
        super().connection_made(transport)
        self._next_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._stop_timer()
        self.table.busy(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.LINGER:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        if self._phase is Phase.HEAD:
            self.table.busy(self)
            if self._timer is None and not self._answering():
                self._start_head_clock()  # a kept-alive connection's next request begins
            if not self._head_fits(data):
                self._refuse(431, f"the request head exceeds {self.limits.max_header_bytes} "
                                  "bytes (the server's --max-header-bytes)",
                             "headers_too_large")
                return
        super().data_received(data)
        if self._phase is Phase.BODY and self._timer is None:
            self._arm(self._since + self.limits.body_timeout_s)

    def _head_fits(self, data: bytes) -> bool:
        """Count `data` into the head: whether the head is still within the limit (when
        this read takes the count past it, the head may yet end inside the read)."""
        before = self._head_bytes
        self._head_bytes += len(data)
        fits = self._head_bytes <= self.limits.max_header_bytes
        if not fits:
            end = (self._tail + data).find(END_OF_HEAD)
            fits = end >= 0 and before - len(self._tail) + end + len(END_OF_HEAD) \
                <= self.limits.max_header_bytes
        self._tail = (self._tail + data[-3:])[-3:]
        return fits

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._stop_timer()
        self._phase = Phase.BODY
        self._since = self._last_byte = self.loop.time()
        self._body_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._last_byte = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._next_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._phase is not Phase.HEAD or self.transport.is_closing():
            return
        if self._head_bytes:  # begun while the answer went out
            self._start_head_clock()
        else:  # kept alive: uvicorn's --timeout-keep-alive closes it if nothing comes
            self.table.idle(self)

    def _next_head(self) -> None:
        """Wait for a head: a new connection's clock runs from now (so one that sends
        nothing is closed), as does that of one whose answer went out before its body
        came in (no keep-alive timer is left to close it)."""
        self._stop_timer()
        self._phase = Phase.HEAD
        self._head_bytes, self._tail = 0, b""
        if not self._answering():
            self.table.idle(self)
            self._start_head_clock()

    def _start_head_clock(self) -> None:
        self._stop_timer()
        self._since = self.loop.time()
        self._arm(self._since + self.limits.header_timeout_s)

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self, due: float) -> None:
        self._timer = self.loop.call_at(due, self._check_clock)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> float | None:
        """When the current phase runs out (it may have moved since the timer was set)."""
        now = self.loop.time()
        if self._phase is Phase.LINGER:
            return self._since + LINGER_S
        if self._phase is Phase.HEAD:
            return None if self._answering() else self._since + self.limits.header_timeout_s
        grace = self.limits.body_timeout_s
        if self.flow.read_paused:  # the server is not reading: no fault of the client's
            self._last_byte = now
            self._since = now - self._body_bytes / BODY_MIN_BYTES_PER_S
        return min(self._last_byte + grace,
                   self._since + grace + self._body_bytes / BODY_MIN_BYTES_PER_S)

    def _check_clock(self) -> None:
        self._timer = None
        due = self._due()
        if due is None or self.transport.is_closing():
            return
        if self.loop.time() < due:
            self._arm(due)
        elif self._phase is not Phase.LINGER and self._bytes_waiting():
            self._arm(self.loop.time() + LATE_LOOP_S)
        elif self._phase is Phase.LINGER:
            self.transport.close()
        elif self._phase is Phase.HEAD and self._head_bytes == 0:
            self.transport.close()  # nothing was sent: an idle connection, closed
        elif self._phase is Phase.HEAD:
            self._refuse(408, "the request head did not arrive within "
                              f"{self.limits.header_timeout_s:g} s (the server's "
                              "--header-timeout)", "request_timeout")
        else:
            self._refuse(408, self._body_late(), "request_timeout")

    def _bytes_waiting(self) -> bool:
        sock = self.transport.get_extra_info("socket")
        if sock is None or self.flow.read_paused:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return struct.unpack("i", waiting)[0] > 0

    def _body_late(self) -> str:
        grace = self.limits.body_timeout_s
        if self.loop.time() - self._last_byte >= grace:
            how = f"then no byte for {grace:g} s"
        else:
            how = f"under {BODY_MIN_BYTES_PER_S // 1024} KiB/s after the first {grace:g} s"
        return (f"the request body stalled: {self._body_bytes} bytes came, {how} (the "
                "server's --body-timeout)")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer `status` and close: after a lingering read when the status can be sent,
        at once when an answer is already going out (it cannot be interleaved)."""
        cycle = self.cycle
        answered = cycle is not None and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app reads a disconnect; its answer goes nowhere
            cycle.message_event.set()
        self._stop_timer()
        self.table.busy(self)
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("%s: %d %s", peer, status, message)
        if answered and not cycle.response_complete:  # type: ignore[union-attr]
            self.transport.close()
            return
        self.transport.write(error_response(status, message, INVALID_REQUEST, code,
                                            self.server_state.default_headers))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._phase, self._since, self._dropped = Phase.LINGER, self.loop.time(), 0
        self.flow.resume_reading()
        self._arm(self._since + LINGER_S)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for one server: its limits, and its own table of connections."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"limits": limits, "table": ConnectionTable()})
