"""The CPU-sharing sampler on fake /proc text: run-queue wait and on-CPU time summed over
threads and never going back when one exits, other processes' CPU net of ours, and the
unavailable path; and on the real /proc, a busy child process seen as the others'."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepserve.host.cpu_share import CpuReading, CpuShare, CpuShareSampler

TICK_S = 0.01  # USER_HZ is 100 on Linux


class FakeProc:
    """A folder laid out as /proc for the files the sampler reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self" / "task").mkdir(parents=True)
        self.t = 0.0

    def thread(self, tid: int, on_ns: int, wait_ns: int) -> None:
        d = self.root / "self" / "task" / str(tid)
        d.mkdir(exist_ok=True)
        (d / "schedstat").write_text(f"{on_ns} {wait_ns} 7\n")

    def exit_thread(self, tid: int) -> None:
        d = self.root / "self" / "task" / str(tid)
        (d / "schedstat").unlink()
        d.rmdir()

    def system(self, user: int, nice: int, system: int, idle: int, steal: int = 0,
               our_utime: int = 0, our_stime: int = 0) -> None:
        (self.root / "stat").write_text(
            f"cpu  {user} {nice} {system} {idle} 5 0 0 {steal} 0 0\ncpu0 1 2 3 4\n")
        # the command name may hold spaces and parentheses
        fields = ["S"] + ["0"] * 10 + [str(our_utime), str(our_stime)] + ["0"] * 30
        (self.root / "self" / "stat").write_text(f"42 (my (odd) name) {' '.join(fields)}\n")

    def clock(self) -> float:
        return self.t

    def sampler(self) -> CpuShareSampler:
        return CpuShareSampler(self.root, cpus=lambda: 2, clock=self.clock)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_thread_totals_sum_over_threads(proc):
    proc.thread(1, 1_000_000_000, 100_000_000)
    proc.thread(2, 500_000_000, 400_000_000)
    proc.system(0, 0, 0, 0)
    sampler = proc.sampler()
    first = sampler.read()
    assert first.on_cpu_s == pytest.approx(1.5) and first.runqueue_wait_s == pytest.approx(0.5)
    proc.thread(1, 2_000_000_000, 300_000_000)
    proc.t = 2.0
    share = CpuShare.between(first, sampler.read())
    # 1 s more on a CPU, 0.2 s more waiting: the threads waited 1/6 of their time
    assert share.wait_share == pytest.approx(0.2 / 1.2)
    assert share.runqueue_wait_s == pytest.approx(0.2)


def test_totals_never_go_back_when_a_thread_exits(proc):
    proc.thread(1, 1_000_000_000, 100_000_000)
    proc.thread(2, 3_000_000_000, 900_000_000)
    sampler = proc.sampler()
    before = sampler.read()
    proc.exit_thread(2)
    after = sampler.read()
    assert after.on_cpu_s == before.on_cpu_s and after.runqueue_wait_s == before.runqueue_wait_s
    proc.thread(1, 1_500_000_000, 100_000_000)
    proc.thread(2, 10_000_000, 20_000_000)  # a new thread given the old tid starts over
    latest = sampler.read()
    assert latest.on_cpu_s == pytest.approx(before.on_cpu_s + 0.5 + 0.01)
    assert latest.runqueue_wait_s == pytest.approx(before.runqueue_wait_s + 0.02)


def test_others_cpu_is_normal_priority_busy_time_less_ours(proc):
    proc.thread(1, 0, 0)
    proc.system(user=1000, nice=500, system=200, idle=9000, steal=10, our_utime=100)
    sampler = proc.sampler()
    first = sampler.read()
    assert first.others_s == 0.0  # counted from the first read
    # 2 s later: 300 user + 100 system ticks in all, 150 of them ours; nice and idle left
    # out; 20 ticks stolen
    proc.system(user=1300, nice=900, system=300, idle=9100, steal=30, our_utime=200,
                our_stime=50)
    proc.t = 2.0
    share = CpuShare.between(first, sampler.read())
    assert share.others_cores == pytest.approx((400 - 150) * TICK_S / 2.0)
    assert share.steal_cores == pytest.approx(20 * TICK_S / 2.0)
    assert share.usable_cpus == 2


def test_unavailable_without_the_files(tmp_path):
    sampler = CpuShareSampler(tmp_path / "no-proc", cpus=lambda: 4)
    reading = sampler.read()
    assert not reading.available
    assert reading.others_s is None and reading.runqueue_wait_s is None
    share = CpuShare.between(reading, sampler.read())
    assert share.others_cores is None and share.wait_share is None
    assert share.usable_cpus == 4


def test_no_schedstat_leaves_only_the_system_part(proc):
    (proc.root / "self" / "task" / "1").mkdir()  # a thread without schedstat
    proc.system(10, 0, 0, 0)
    reading = proc.sampler().read()
    assert reading.available and reading.runqueue_wait_s is None and reading.others_s == 0


def _others_cores(sampler: CpuShareSampler, start: CpuReading) -> float:
    share = CpuShare.between(start, sampler.read())
    return share.others_cores or 0.0


@pytest.mark.timing
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_a_busy_child_process_counts_as_others():
    sampler = CpuShareSampler()
    start = sampler.read()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # the child burns a core; over a second or more it shows as the others' CPU
        # (a generous bound: the machine may be busy, and the child may be starved)
        deadline = time.monotonic() + 60
        while not (time.monotonic() - start.t_s >= 1.0
                   and _others_cores(sampler, start) > 0.5):
            assert time.monotonic() < deadline, "the busy child never showed"
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_bench_engine_records_the_cpu_it_shared():
    pytest.importorskip("torch")
    from stepserve.bench.inprocess import run_engine
    from stepserve.bench.loadgen import LoadPlan
    from stepserve.config.settings import EngineConfig
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.workload.spec import RequestSpec

    engine = LLMEngine("tiny", EngineConfig().replace(num_gpu_blocks=64, max_model_len=128,
                                                       max_num_seqs=2))
    specs = [RequestSpec(index=i, arrival_s=0.0, prompt_len=8, output_len=24, max_tokens=24)
             for i in range(2)]
    _, keys, _ = run_engine(LoadPlan(specs), engine)
    assert keys.cpu_source == "engine" and keys.cpu_usable == len(os.sched_getaffinity(0))
    assert keys.cpu_others_cores is not None and keys.cpu_others_cores >= 0
    assert keys.cpu_wait_share is not None and 0 <= keys.cpu_wait_share <= 1
    assert keys.step_time_over_quiet is not None and keys.step_time_over_quiet > 0
    assert "cpu_others_cores" in keys.to_json()


def _runnable(proc: FakeProc, procs_running: int, states: dict[int, str]) -> None:
    """/proc/stat's procs_running and this process's threads in the given states."""
    (proc.root / "stat").write_text(f"cpu  1 0 1 1 0 0 0 0 0 0\nprocs_running {procs_running}\n"
                                    "procs_blocked 0\n")
    for tid, state in states.items():
        d = proc.root / "self" / "task" / str(tid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(f"{tid} (a (b) c) {state} 1 2 3\n")


def test_running_others_are_the_runnable_threads_not_ours(proc):
    _runnable(proc, 3, {1: "R", 2: "S", 3: "R"})  # two of ours run: one other
    assert proc.sampler().running_others(looks=1) == 1
    _runnable(proc, 2, {1: "R", 2: "R", 3: "R"})  # read at different instants: never < 0
    assert proc.sampler().running_others(looks=1) == 0


def test_running_others_take_the_least_of_several_looks(proc, monkeypatch):
    counts = iter([2, 0, 2])  # a neighbour runnable in two looks of three: a burst
    sampler = proc.sampler()
    monkeypatch.setattr(sampler, "_running_others", lambda: next(counts))
    assert sampler.running_others(looks=3, gap_s=0) == 0


def test_running_others_unreadable_is_none(proc):
    assert proc.sampler().running_others(looks=1) is None  # no /proc/stat
    (proc.root / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\n")  # no procs_running line
    assert proc.sampler().running_others(looks=1) is None


GLANCES = 200  # looks at a child known to be looping, each after a 10 ms pause


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_a_busy_child_process_is_running_at_a_glance():
    sampler = CpuShareSampler()
    child = subprocess.Popen([sys.executable, "-c", "print('looping', flush=True)\n"
                              "while True: pass"], stdout=subprocess.PIPE, text=True)
    try:
        # its line says it runs; runnable from then on, whether or not it holds a core
        assert child.stdout is not None and child.stdout.readline() == "looping\n"
        seen = []
        for _ in range(GLANCES):
            seen.append(sampler.running_others(looks=1))
            if seen[-1] is not None and seen[-1] >= 1:
                break
            assert child.poll() is None, "the busy child exited"
            time.sleep(0.01)
        else:
            pytest.fail(f"a looping child never showed as runnable in {GLANCES} glances "
                        f"(the last said {seen[-5:]}): the sampler misses other processes")
    finally:
        child.kill()
        child.wait()


def _other_thread(proc: FakeProc, pid: int, state: str, nice: int, group: str | None) -> None:
    d = proc.root / str(pid) / "task" / str(pid)
    d.mkdir(parents=True)
    rest = [state] + ["0"] * 15 + [str(nice)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} (busy loop) {' '.join(rest)}\n")
    if group is not None:
        (proc.root / str(pid) / "autogroup").write_text(f"{group} nice {nice}\n")


def test_a_niced_neighbour_in_our_autogroup_yields_and_is_not_counted(proc):
    _runnable(proc, 4, {42: "R"})  # ours: one running; three others runnable
    (proc.root / "self" / "stat").write_text("42 (me) R 1 2 3\n")
    (proc.root / "self" / "autogroup").write_text("/autogroup-7 nice 0\n")
    (proc.root / "sys" / "kernel").mkdir(parents=True)
    (proc.root / "sys" / "kernel" / "sched_autogroup_enabled").write_text("1\n")
    _other_thread(proc, 100, "R", 0, "/autogroup-7")    # normal priority: counts
    _other_thread(proc, 101, "R", 19, "/autogroup-7")   # nice 19, our session: yields
    _other_thread(proc, 102, "R", 19, "/autogroup-9")   # nice 19, its own session: counts
    _other_thread(proc, 103, "S", 0, "/autogroup-7")    # asleep
    assert proc.sampler().running_others(looks=1) == 2
    (proc.root / "sys" / "kernel" / "sched_autogroup_enabled").write_text("0\n")
    assert proc.sampler().running_others(looks=1) == 1  # no autogroups: every nice yields
