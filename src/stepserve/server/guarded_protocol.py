"""uvicorn's httptools protocol with `ConnectionLimits` enforced, below any app code (so
before the API key is looked at):

* the request head is counted as its bytes arrive, before the parser sees them; past
  `max_header_bytes` the answer is 431 and the parser never holds more than one read
  beyond the limit;
* one timer per connection, armed only while the server waits on the client: for the
  head from the connection on (on a kept-alive connection, from the next request's
  first byte: until then uvicorn's keep-alive timeout applies), for the body from the
  end of the head until its last byte. Never while an answer is being sent: a stream of
  any length is untouched. A stalled head or body gets 408; a new connection that sent
  nothing is closed silently, as uvicorn closes an idle kept-alive one;
* at `max_connections`, a new connection displaces the longest-idle one holding no
  request; if every one is busy it gets 503 and is closed at once.

A refusal goes out in OpenAI's error shape with `connection: close`; then the server
stops sending, reads and drops what the client still sends for up to LINGER_S (or
LINGER_BYTES) and closes, so the client reads the status rather than a reset (nginx's
lingering close).
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import http
import json
import logging
import struct
import termios
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stepserve.server.connection_limits import BODY_MIN_BYTES_PER_S, ConnectionLimits
from stepserve.server.connection_table import ConnectionTable
from stepserve.server.errors import INVALID_REQUEST, UNAVAILABLE, APIError

log = logging.getLogger("stepserve.server")

LINGER_S = 2.0
LINGER_BYTES = 1 << 20
# A deadline that passes with the client's bytes already waiting in the socket was the
# event loop's lateness (libuv runs due timers before it reads): look again this much later.
LATE_LOOP_S = 0.01
END_OF_HEAD = b"\r\n\r\n"  # llhttp takes no bare-LF heads


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

    # ---- connections ----

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.connection_cap \
                and not self.table.close_oldest_idle():
            self._refused = True
            self.table.note_refused(self.loop.time(), self.limits.connection_cap)
            transport.write(error_response(
                503, f"the server holds its maximum of {self.limits.connection_cap} "
                     "connections, each busy with a request; try again shortly",
                UNAVAILABLE, "too_many_connections",
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

    # ---- reading ----

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.LINGER:
            self._drop(len(data))
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

    # ---- the clock ----

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

    # ---- refusing ----

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
        log.info("%s: %d %s", self._peer(), status, message)
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

    def _drop(self, n: int) -> None:
        self._dropped += n
        if self._dropped > LINGER_BYTES:
            self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for one server: its limits, and its own table of connections."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"limits": limits, "table": ConnectionTable()})
