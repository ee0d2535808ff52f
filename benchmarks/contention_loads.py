"""Competing work for benchmarks/contention.py: each condition a context manager that
starts its load in other processes and, on the way out (an exception or Ctrl-C too),
kills every one of them and removes what they wrote.

* quiet: nothing;
* busy: one `sh -c 'while :; do :; done'` at normal priority;
* busy-nice19: the same at nice 19 (what a well-behaved background job would run at),
  started in a session of its own, as a job from another login or a service would be:
  with the kernel's autogroups its nice counts only inside that session;
* busy-nice19-here: the same in this benchmark's own session (its own process group),
  where nice 19 does make it low priority to the server;
* compile: two jobs, each alternating a CPU burst of arithmetic (50-100 ms) and a file
  write of a few MB with fsync, the shape of a two-job build (`make -j2`).

Each child runs in a process group of its own (in a session of its own but for
busy-nice19-here), so a signal to the group kills it and anything it started, and Ctrl-C
at the terminal reaches only this process, whose `finally` ends them. A SIGKILL of this
process itself cannot be caught: then the loads outlive it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

BUSY_LOOP = ("sh", "-c", "while :; do :; done")
# nice values run from -20 to 19; 19 is the lowest priority an unprivileged user can set
LOWEST_PRIORITY = 19
COMPILE_JOBS = 2
COMPILE_BURST_MS = (50, 100)
COMPILE_WRITE_MB = 4
# each job overwrites this many files in turn, so the scratch folder stays bounded
# (jobs x files x MB: 32 MB by default) however long the run
COMPILE_FILES_PER_JOB = 4

# One compile job: argv is scratch folder, job index, burst low/high ms, MB per write,
# files in rotation. Arithmetic until the burst's time is up, then an "object file" written
# and fsynced, as a compiler's translation unit ends in a write.
COMPILE_JOB = """
import os, random, sys, time
scratch, job, lo, hi, mb, files = sys.argv[1:7]
lo, hi, mb, files = int(lo), int(hi), int(mb), int(files)
rng = random.Random(int(job))
data = bytes(range(256)) * (mb * 4096)
n = 0
while True:
    end = time.perf_counter() + rng.uniform(lo, hi) / 1e3
    x = 0
    while time.perf_counter() < end:
        for i in range(2000):
            x = (x * 31 + i) % 1000003
    path = os.path.join(scratch, f"job{job}-{n % files}.o")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    n += 1
"""


@dataclass
class Started:
    """A condition's running load: its processes (none when quiet) and, for a load that
    writes, the folder it writes in (removed on exit)."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    scratch: Path | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def exited(self) -> list[int]:
        """The pids of children that have stopped on their own: the load was lighter than
        named for part of the run."""
        return [p.pid for p in self.procs if p.poll() is not None]


@dataclass(frozen=True)
class Condition:
    name: str
    what: str
    start: Callable[[], AbstractContextManager[Started]]


def _kill_groups(procs: list[subprocess.Popen]) -> None:
    """Every group signalled before any is waited for: a second Ctrl-C while reaping
    leaves no load running."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: the group id is its pid
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait()


@contextmanager
def _children(cmds: list[list[str]], niceness: int | None = None,
              own_session: bool = True) -> Iterator[Started]:
    """Start each command in a session of its own (or, `own_session` False, a process
    group of its own in this session) at `niceness`, absolute, if given; on the way out,
    kill every group and reap every child."""
    started = Started()
    try:
        for cmd in cmds:
            where = {"start_new_session": True} if own_session else {"process_group": 0}
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    **where)
            started.procs.append(proc)
            if niceness is not None:
                # from outside, once it runs: no preexec_fn (unsafe beside threads), and a
                # child cannot be caught between `nice` and the exec of its command
                os.setpriority(os.PRIO_PROCESS, proc.pid, niceness)
        yield started
    finally:
        _kill_groups(started.procs)


@contextmanager
def quiet() -> Iterator[Started]:
    yield Started()


@contextmanager
def busy_loop(niceness: int | None = None, own_session: bool = True) -> Iterator[Started]:
    """One process spinning on a core; `niceness` None: this process's own priority."""
    with _children([list(BUSY_LOOP)], niceness, own_session) as started:
        yield started


@contextmanager
def compile_like(jobs: int = COMPILE_JOBS, burst_ms: tuple[int, int] = COMPILE_BURST_MS,
                 write_mb: int = COMPILE_WRITE_MB, scratch_root: str | None = None
                 ) -> Iterator[Started]:
    """`jobs` processes alternating a CPU burst and a write + fsync of `write_mb` MB into
    a fresh folder under `scratch_root` (default: the system's temp folder; on tmpfs the
    fsync reaches no disk)."""
    scratch = Path(tempfile.mkdtemp(prefix="stepserve-contention-", dir=scratch_root))
    try:
        cmds = [[sys.executable, "-c", COMPILE_JOB, str(scratch), str(job), str(burst_ms[0]),
                 str(burst_ms[1]), str(write_mb), str(COMPILE_FILES_PER_JOB)]
                for job in range(jobs)]
        with _children(cmds) as started:
            started.scratch = scratch
            yield started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def conditions(scratch_root: str | None = None) -> tuple[Condition, ...]:
    """Every condition, quiet first (the others are compared with it)."""
    lo, hi = COMPILE_BURST_MS
    return (
        Condition("quiet", "nothing else running", quiet),
        Condition("busy", "one busy loop (sh) at normal priority", busy_loop),
        Condition("busy-nice19", f"one busy loop (sh) at nice {LOWEST_PRIORITY}",
                  partial(busy_loop, LOWEST_PRIORITY)),
        Condition("busy-nice19-here", f"one busy loop (sh) at nice {LOWEST_PRIORITY} in "
                  "this session", partial(busy_loop, LOWEST_PRIORITY, own_session=False)),
        Condition("compile", f"{COMPILE_JOBS} jobs, each a {lo}-{hi} ms CPU burst then a "
                  f"{COMPILE_WRITE_MB} MB write + fsync, in turn",
                  partial(compile_like, scratch_root=scratch_root)),
    )
