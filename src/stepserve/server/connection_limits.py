"""What one connection may hold of the server: how large its request head, how long it
may take to send the head and the body, how long it may sit idle, and how many
connections there may be at once. `guarded_protocol.py` enforces them.

Without them, one client stops every other: a 100 MB header was parsed for 12-17 s with
the event loop held, a head dribbled a byte at a time or a body announced and never sent
held its connection forever, and 20,000 idle connections took every file descriptor, so
new clients (probes of /health too) were reset.

The defaults, beside what other servers do:
* request head 64 KiB (`--max-header-bytes`): Node allows 16 KiB, nginx 4 x 8 KiB
  buffers, Go 1 MiB; 64 KiB leaves room for long tokens and cookies. Over it: 431.
* head within 10 s of the connection, or of its first byte on a kept-alive connection
  (`--header-timeout`): Node's headersTimeout is 60 s, Apache's 20-40 s; a real client
  sends its head in one packet, so 10 s is generous. Over it: 408, or a silent close
  when not a byte came.
* body (`--body-timeout`, 30 s): 408 once no byte came for that long, or once the body
  falls behind BODY_MIN_BYTES_PER_S after that grace, so a body dribbled a byte at a
  time is cut as surely as one never sent (nginx's client_body_timeout is 60 s between
  reads; Apache's RequestReadTimeout body=20,MinRate=500 is the same two rules).
* idle keep-alive 5 s (`--timeout-keep-alive`): uvicorn's, vLLM's and Node's default.
* 2,048 connections (`--max-connections`), never more than the open-file limit (raised
  from its soft to its hard value at startup) less FD_RESERVE: nginx serves 512 or
  1,024 a worker, gunicorn's async workers 1,000; uvicorn, Node and Go set none. At the
  cap a new connection displaces the longest-idle one that holds no request (as nginx
  reuses its idle keep-alive connections); if every one is busy, it gets 503 and is
  closed at once.
"""

from __future__ import annotations

import logging
import math
import resource
from dataclasses import dataclass, replace

from stepserve.config.errors import UsageError
from stepserve.config.limits import (
    MAX_CONCURRENCY,
    MAX_HEADER_BYTES,
    SECONDS,
    WAIT_SECONDS,
    Range,
)

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
