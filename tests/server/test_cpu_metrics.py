"""Whether the CPU is shared, on a real server's /metrics: the series are there and
parse, the quiet step reference reads after some steps, and a window of scrapes feeds the
doctor's cpu_shared rule (the host's numbers faked under the server, so the rule's
firing does not depend on what else this machine runs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import MODEL, Served, serve

from stepserve.host.cpu_share import CpuShareSampler
from stepserve.host.step_reference import MIN_STEPS
from stepserve.metrics.live_window import live_summary
from stepserve.metrics.prometheus import Snapshot, parse_prometheus
from stepserve.metrics.rules import CPU_SHARED, diagnose

LINUX = Path("/proc/self/task").exists()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve() as s:
        yield s


def complete(served: Served, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": "the cores are shared", "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}
    resp = httpx.post(served.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text


def scrape(served: Served, t_s: float) -> Snapshot:
    return Snapshot(t_s, parse_prometheus(httpx.get(served.url + "/metrics").text))


@pytest.mark.skipif(not LINUX, reason="needs Linux's /proc")
def test_the_series_parse(served):
    before = served.metrics()
    complete(served, max_tokens=4 * MIN_STEPS)  # decode steps of one shape
    after = served.metrics()
    for name in ("stepserve:cpu_runqueue_wait_seconds_total",
                 "stepserve:cpu_on_cpu_seconds_total", "stepserve:cpu_others_seconds_total",
                 "stepserve:cpu_steal_seconds_total"):
        assert after[name] >= before[name] >= 0, name
    assert after["stepserve:cpu_on_cpu_seconds_total"] > before[
        "stepserve:cpu_on_cpu_seconds_total"]
    assert after["stepserve:cpu_usable"] == len(os.sched_getaffinity(0))
    assert after["stepserve:step_time_over_quiet"] > 0
    policy = served.engine.step_threads
    assert after["stepserve:step_threads"] == policy.choice.threads >= 1
    assert after["stepserve:step_threads_changes_total"] == policy.choice.changes


class FakeHost:
    """/proc text for the server's sampler: one thread, and the system's jiffies."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self" / "task" / "1").mkdir(parents=True)
        (root / "self" / "stat").write_text("1 (stepserve) S " + " ".join(["0"] * 40))
        self.set(on_ns=0, wait_ns=0, user_ticks=0)

    def set(self, on_ns: int, wait_ns: int, user_ticks: int) -> None:
        (self.root / "self" / "task" / "1" / "schedstat").write_text(f"{on_ns} {wait_ns} 1")
        (self.root / "stat").write_text(f"cpu  {user_ticks} 0 0 1000 0 0 0 0 0 0\n")


def test_a_window_of_scrapes_feeds_the_rule(served, tmp_path):
    metrics = served.app.state.metrics
    real = metrics.cpu.sampler
    host = FakeHost(tmp_path / "proc")
    metrics.cpu.sampler = CpuShareSampler(host.root, cpus=lambda: 2)
    try:
        metrics.cpu.sampler.read()
        first = scrape(served, t_s=0.0)
        complete(served, max_tokens=4)  # the engine works in the window
        # over the 10 s window: others took 9.8 CPU s (980 ticks), the threads ran 6.5 s
        # and waited 3.5 s for a core
        host.set(on_ns=6_500_000_000, wait_ns=3_500_000_000, user_ticks=980)
        last = scrape(served, t_s=10.0)
    finally:
        metrics.cpu.sampler = real
    summary = live_summary([first, last])
    assert summary.cpu_source == "server" and summary.cpu_usable == 2
    assert summary.cpu_others_cores == pytest.approx(0.98)
    assert summary.cpu_wait_share == pytest.approx(0.35)
    found = diagnose(summary)
    assert found[0].rule == CPU_SHARED
    assert "other processes used 0.98 of 2 cores" in found[0].evidence
    assert "waited 35% of their time" in found[0].evidence


def test_a_quiet_host_window_is_silent(served, tmp_path):
    metrics = served.app.state.metrics
    real = metrics.cpu.sampler
    host = FakeHost(tmp_path / "proc")
    metrics.cpu.sampler = CpuShareSampler(host.root, cpus=lambda: 2)
    try:
        metrics.cpu.sampler.read()
        first = scrape(served, t_s=0.0)
        complete(served, max_tokens=4)
        host.set(on_ns=9_900_000_000, wait_ns=100_000_000, user_ticks=2)
        last = scrape(served, t_s=10.0)
    finally:
        metrics.cpu.sampler = real
    assert all(f.rule != CPU_SHARED for f in diagnose(live_summary([first, last])))
