"""Whether the engine shares its CPUs, from /proc, read a few times a second at most (a
scrape, a bench run's two ends), never per step.

* This process's threads' run-queue wait and time on a CPU: each tid's schedstat, summed
  as per-tid increases (an exited thread's share stays counted, a reused tid starts over).
* Other processes' CPU at normal or higher priority: /proc/stat's user + system + irq +
  softirq less our own utime + stime (nice time apart: our nice-0 threads preempt it;
  steal apart; the increase floored at 0, for a process of ours running niced).
* Usable CPUs: the affinity mask (a cgroup quota is not read).

A file that is not there (not Linux, no schedstat) makes its part None (`available`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from stepserve.core.output import StepRecord
from stepserve.host.step_reference import step_time_over_quiet

NS = 1e-9
# the run summary's cpu fields (metrics/run_summary.py), in the order they are reported
CPU_KEYS = ("cpu_others_cores", "cpu_wait_share", "cpu_usable", "step_time_over_quiet",
            "cpu_source")


def read_schedstat(path: str | Path) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) from a thread's schedstat file; None
    where it cannot be read (the thread exited, or the kernel keeps no schedstat)."""
    try:
        on, wait = Path(path).read_text().split()[:2]
        return int(on), int(wait)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class CpuReading:
    """Totals since the sampler began (or the server started: a scraped page), at time
    `t_s`; None where unavailable."""

    t_s: float
    runqueue_wait_s: float | None  # this process's threads, waiting for a core
    on_cpu_s: float | None  # this process's threads, on a core
    others_s: float | None  # other processes at normal priority
    steal_s: float | None
    usable_cpus: float | None  # None: a page without the gauge
    nice_s: float | None = None  # everyone's time at positive nice (ours included, if niced)

    @property
    def available(self) -> bool:
        return self.runqueue_wait_s is not None or self.others_s is not None


@dataclass(frozen=True, slots=True)
class CpuShare:
    """What happened between two readings, as rates and shares."""

    wall_s: float
    others_cores: float | None  # others' CPU seconds / wall seconds
    steal_cores: float | None
    wait_share: float | None  # wait / (on cpu + wait) of this process's threads
    runqueue_wait_s: float | None
    usable_cpus: float | None
    nice_cores: float | None = None  # processes at positive nice, CPU s / wall s

    @classmethod
    def between(cls, a: CpuReading, b: CpuReading) -> CpuShare:
        wall = b.t_s - a.t_s

        def rate(x: float | None, y: float | None) -> float | None:
            up = _increase(x, y)
            return None if up is None or wall <= 0 else up / wall

        wait = _increase(a.runqueue_wait_s, b.runqueue_wait_s)
        on = _increase(a.on_cpu_s, b.on_cpu_s)
        share = wait / (wait + on) if wait is not None and on is not None \
            and wait + on > 0 else None
        return cls(wall, rate(a.others_s, b.others_s), rate(a.steal_s, b.steal_s), share,
                   wait, b.usable_cpus, rate(a.nice_s, b.nice_s))

    def fields(self, source: str,
               step_time_over_quiet: float | None = None) -> dict[str, float | str | None]:
        """The run summary's cpu fields (CPU_KEYS) for this window, measured by `source`
        (engine, server or client)."""
        usable = None if self.usable_cpus is None else float(self.usable_cpus)
        return dict(zip(CPU_KEYS, (self.others_cores, self.wait_share, usable,
                                   step_time_over_quiet, source), strict=True))


def _increase(a: float | None, b: float | None) -> float | None:
    """A total's increase from `a` to `b`. A sampler's totals never go back; a server's
    that did was restarted in between, and counts from its start."""
    return None if a is None or b is None else b - a if b >= a else b


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class CpuShareSampler:
    """Reads the CPU facts above under `root` (/proc; a test passes a folder of fake
    files). Thread-safe: a scrape and the bench may read it at once."""

    def __init__(self, root: str | Path = "/proc",
                 cpus: Callable[[], int] = usable_cpus,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self._cpus, self._clock = cpus, clock
        self._tick_s = 1.0 / _clock_ticks()
        self._lock = threading.Lock()
        self._last_by_tid: dict[str, tuple[int, int]] = {}
        self._on_ns = self._wait_ns = 0
        self._others_s = self._steal_s = self._nice_s = 0.0
        self._last_system: tuple[float, float, float, float] | None = None  # busy, steal,
        # ours, nice

    def read(self) -> CpuReading:
        with self._lock:
            threads = self._read_threads()
            system = self._read_system()
            return CpuReading(
                self._clock(),
                self._wait_ns * NS if threads else None,
                self._on_ns * NS if threads else None,
                self._others_s if system else None,
                self._steal_s if system else None,
                self._cpus(),
                self._nice_s if system else None)

    def running_others(self, looks: int = 5, gap_s: float = 0.001) -> int | None:
        """Threads of other processes runnable right now that would hold a core against
        ours: /proc/stat's procs_running (every runnable thread, the reader included)
        less this process's threads in state R, the least of `looks` readings `gap_s`
        apart (a busy neighbour is runnable in every one, a client's burst seldom is);
        where any are, the runnable threads themselves, less those at positive nice in
        our own autogroup (they yield to us). None where unreadable. An instant, not a
        window: what StepThreads goes by where it has no fresh window."""
        least = None
        for look in range(looks):
            if look:
                time.sleep(gap_s)
            others = self._running_others()
            if others is None:
                return None
            least = others if least is None else min(least, others)
            if not least:  # a quiet machine costs one read
                break
        if not least:
            return least
        taking = self._runnable_taking_a_core()
        return least if taking is None else min(least, taking)

    def _running_others(self) -> int | None:
        try:
            stat = (self.root / "stat").read_text()
            running = next(int(line.split()[1]) for line in stat.splitlines()
                           if line.startswith("procs_running "))
            ours = sum(fields[0] == "R" for fields in self._task_stats("self"))
        except (OSError, ValueError, IndexError, StopIteration):
            return None
        return max(0, running - ours)

    def _task_stats(self, pid: str) -> Iterator[list[str]]:
        """The stat fields (_stat_fields) of each thread of `pid` that is still there;
        OSError where its threads cannot be listed."""
        for tid in os.listdir(self.root / pid / "task"):
            try:
                fields = _stat_fields((self.root / pid / "task" / tid / "stat").read_text())
            except (OSError, ValueError):
                continue  # exited since the listing
            if fields:
                yield fields

    def _runnable_taking_a_core(self) -> int | None:
        """Other processes' threads in state R, a niced one only from another autogroup
        (where its nice value does not count against ours); None where /proc cannot be
        listed."""
        try:
            pids = [p for p in os.listdir(self.root) if p.isdigit()]
            own = (self.root / "self" / "stat").read_text().split(maxsplit=1)[0]
        except (OSError, IndexError):
            return None
        groups_on = self._autogroups_on()
        group = self._autogroup("self") if groups_on else None
        count = 0
        for pid in (p for p in pids if p != own):
            try:
                threads = list(self._task_stats(pid))
            except OSError:
                continue  # exited since the listing
            for fields in threads:
                try:
                    nice = int(fields[16])
                except (ValueError, IndexError):
                    continue
                if fields[0] == "R" and (nice <= 0 or (groups_on and (
                        group is None or self._autogroup(pid) != group))):
                    count += 1
        return count

    def _autogroups_on(self) -> bool:
        """Whether the kernel groups processes by session (then a nice value counts only
        within its own group)."""
        try:
            flag = self.root / "sys" / "kernel" / "sched_autogroup_enabled"
            return flag.read_text().strip() == "1"
        except OSError:
            return False

    def _autogroup(self, pid: str) -> str | None:
        try:
            return (self.root / pid / "autogroup").read_text().split()[0]
        except (OSError, IndexError):
            return None

    def _read_threads(self) -> bool:
        """Adds each thread's increase since the last read; False where unreadable."""
        try:
            tids = os.listdir(self.root / "self" / "task")
        except OSError:
            return False
        now: dict[str, tuple[int, int]] = {}
        for tid in tids:
            stat = read_schedstat(self.root / "self" / "task" / tid / "schedstat")
            if stat is None:
                continue  # exited between the listing and the read, or no schedstat
            on, wait = now[tid] = stat
            last_on, last_wait = self._last_by_tid.get(tid, (0, 0))
            if on < last_on or wait < last_wait:  # a reused tid starts over
                last_on = last_wait = 0
            self._on_ns += on - last_on
            self._wait_ns += wait - last_wait
        if not now:
            return False
        self._last_by_tid = now
        return True

    def _read_system(self) -> bool:
        try:
            cpu = (self.root / "stat").read_text().split("\n", 1)[0].split()
            user, nice, system, _idle, _iowait, irq, softirq, steal = \
                (int(x) for x in cpu[1:9])
            ours = _own_cpu_ticks((self.root / "self" / "stat").read_text())
        except (OSError, ValueError, IndexError):
            return False
        busy = (user + system + irq + softirq) * self._tick_s
        now = (busy, steal * self._tick_s, ours * self._tick_s, nice * self._tick_s)
        if self._last_system is not None:
            d_busy, d_steal, d_ours, d_nice = (x - y for x, y in zip(now, self._last_system,
                                                                     strict=True))
            self._others_s += max(0.0, d_busy - d_ours)
            self._steal_s += max(0.0, d_steal)
            self._nice_s += max(0.0, d_nice)
        self._last_system = now
        return True


def _stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat (or task stat) line after the name: the state
    (field 3) first. The name in parentheses may hold spaces and parentheses, so count
    from its closing one."""
    return stat[stat.rindex(")") + 2:].split()


def _own_cpu_ticks(stat: str) -> int:
    """utime + stime from /proc/<pid>/stat (fields 14 and 15)."""
    rest = _stat_fields(stat)
    return int(rest[11]) + int(rest[12])


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


class CpuWatch:
    """A bench run's CPU sharing seen from this process, read at `start` and for its
    fields: source "engine" under `bench --engine` (the engine's threads are ours);
    "client" against a target without CPU series (a server on this machine then counts
    among the others), which the doctor does not read as the engine's."""

    def __init__(self, sampler: CpuShareSampler, start: CpuReading) -> None:
        self.sampler, self.start_reading = sampler, start

    @classmethod
    def start(cls) -> CpuWatch:
        sampler = CpuShareSampler()
        return cls(sampler, sampler.read())

    def fields(self, source: str,
               steps: Sequence[StepRecord] = ()) -> dict[str, float | str | None]:
        """The cpu fields since `start` measured by `source`; where the host says nothing,
        only the steps' time over their quiet time (if there are steps)."""
        end = self.sampler.read()
        over = step_time_over_quiet(steps) if steps else None
        if not end.available:
            return {} if over is None else {"step_time_over_quiet": over}
        return CpuShare.between(self.start_reading, end).fields(source, over)
