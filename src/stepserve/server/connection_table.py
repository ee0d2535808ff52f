"""A server's table of its connections that hold no request (none begun, no answer going
out), oldest first: at the connection cap a new connection displaces the oldest of them
(as nginx reuses its idle keep-alive connections), so idle connections, however many an
attacker opens, cannot keep a real client out. Also the count of connections refused
while every one was busy, warned about at most every WARN_EVERY_S.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("stepserve.server")

WARN_EVERY_S = 10.0


class Connection(Protocol):
    transport: asyncio.Transport


class ConnectionTable:
    def __init__(self) -> None:
        self._idle: dict[Connection, None] = {}  # insertion order: longest idle first
        self._refused = 0  # since the last warning
        self._warned_at = float("-inf")

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def idle(self, conn: Connection) -> None:
        self._idle.pop(conn, None)
        self._idle[conn] = None

    def busy(self, conn: Connection) -> None:
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
        if now - self._warned_at >= WARN_EVERY_S:
            log.warning("%d connections refused (503): all %d connections busy with a "
                        "request", self._refused, cap)
            self._refused, self._warned_at = 0, now
