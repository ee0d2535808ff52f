"""Long renders give the interpreter lock away on a schedule.

A big answer (a quarter of a million logprob entries) takes a render thread about a
second of pure Python. The engine thread releases the interpreter lock around every
torch call and must take it back after each; while a render holds the lock, each take
waits out the interpreter's switch interval (5 ms), and a decode step of a few
milliseconds became half a second for every stream on the server. So a render thread
rests for REST_S after every WORK_S of work: the engine's step runs through while it
rests, and the render takes about half again as long.

Only threads that `render_thread()` marked pace themselves: a render that runs on the
event loop (a small answer) never sleeps there.
"""

from __future__ import annotations

import threading
import time

WORK_S = 0.002  # render work between rests
REST_S = 0.001  # a rest: the lock is free for the engine and the event loop

_local = threading.local()


def render_thread() -> None:
    """A thread pool's initializer: this thread's renders pace themselves."""
    _local.since = time.perf_counter()


def pace() -> None:
    """Called between pieces of a render (a token, a position): rests when due."""
    since = getattr(_local, "since", None)
    if since is None:
        return
    if time.perf_counter() - since >= WORK_S:
        time.sleep(REST_S)
        _local.since = time.perf_counter()
