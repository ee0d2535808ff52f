"""Whether a server shares its CPU: the series on /metrics, read at scrape time, and read
back from two scraped pages as a run's cpu fields (`doctor --url`, `bench --target`).
Counters run since the server started; a series the host cannot read is absent. On a
page of several engines (a cluster's) each counts the others from its own process: the
others' CPU and the gauges are the largest engine's, the wait and on-CPU times a sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepserve.core.output import StepRecord
from stepserve.host.cpu_share import CpuReading, CpuShare, CpuShareSampler
from stepserve.host.step_reference import QuietStepReference
from stepserve.host.step_threads import StepThreads

P = "stepserve:"


class Page(Protocol):
    """A scraped /metrics page (metrics/prometheus.py's Snapshot)."""

    t_s: float
    samples: Mapping[tuple[str, Any], float]


def _values(page: Page, name: str) -> list[float]:
    return [v for (n, _labels), v in page.samples.items()
            if n == P + name and not math.isnan(v)]


def _sum(page: Page, name: str) -> float | None:
    vals = _values(page, name)
    return sum(vals) if vals else None


def _max(page: Page, name: str) -> float | None:
    return max(_values(page, name), default=None)


# (series, the CpuReading total it publishes, help, how a page of several engines adds up)
COUNTERS: tuple[tuple[str, str, str, Callable[[Page, str], float | None]], ...] = (
    ("cpu_runqueue_wait_seconds", "runqueue_wait_s",
     "this process's threads' time waiting on a run queue for a core", _sum),
    ("cpu_on_cpu_seconds", "on_cpu_s", "this process's threads' time on a core", _sum),
    ("cpu_others_seconds", "others_s",
     "CPU time of other processes at normal (or higher) priority", _max),
    ("cpu_steal_seconds", "steal_s", "CPU time a hypervisor took (steal)", _max),
)


class CpuMetrics:
    """One app's CPU-sharing series (labels `labels`, values `label_values`)."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 label_values: tuple[str, ...]) -> None:
        self.labels = labels
        self.label_values = list(label_values)
        self.sampler = CpuShareSampler()
        self.sampler.read()  # the counters count from here
        self.reference = QuietStepReference()
        self._threads: StepThreads | None = None
        registry.register(self)

    def watch(self, threads: StepThreads) -> None:
        """Report the engine's thread policy (its current choice, read at scrape time)."""
        self._threads = threads

    def on_steps(self, records: Sequence[StepRecord]) -> None:
        self.reference.add_all(records)

    def collect(self) -> Iterator[Metric]:
        reading = self.sampler.read()
        counters = [(name, doc, getattr(reading, attr)) for name, attr, doc, _ in COUNTERS]
        gauges = [("cpu_usable", "CPUs this process may run on", reading.usable_cpus)]
        if self._threads is not None:  # absent until the engine is watched
            choice = self._threads.choice
            counters.append(("step_threads_changes", "changes of the steps' thread count",
                             choice.changes))
            gauges.append(("step_threads", "CPU threads the engine's steps run on now",
                           choice.threads))
        gauges.append(("step_time_over_quiet", "recent step time over the quiet time of the "
                       "same step shapes", self.reference.over_quiet()))
        for kind, series in ((CounterMetricFamily, counters), (GaugeMetricFamily, gauges)):
            for name, doc, value in series:
                if value is not None:  # the host does not say, or no shape has a reference
                    family = kind(P + name, doc, labels=self.labels)
                    family.add_metric(self.label_values, value)
                    yield family

    def describe(self) -> list[Metric]:
        """The names, for the registry's clash check."""
        return [*(CounterMetricFamily(P + name, "") for name, *_ in COUNTERS),
                GaugeMetricFamily(P + "cpu_usable", ""),
                GaugeMetricFamily(P + "step_threads", ""),
                CounterMetricFamily(P + "step_threads_changes", ""),
                GaugeMetricFamily(P + "step_time_over_quiet", "")]


def page_reading(page: Page) -> CpuReading:
    """The CpuReading a server published on `page` (None where a series is absent)."""
    totals = {attr: pick(page, name + "_total") for name, attr, _, pick in COUNTERS}
    return CpuReading(page.t_s, usable_cpus=_max(page, "cpu_usable"), **totals)


def cpu_window(first: Page, last: Page) -> dict[str, float | str | None]:
    """The run summary's cpu fields over the window from `first` to `last`: the gauges
    at its end; cpu_source "server" where any of them was published, else all None."""
    share = CpuShare.between(page_reading(first), page_reading(last))
    out = share.fields("server", _max(last, "step_time_over_quiet"))
    if all(v is None for k, v in out.items() if k != "cpu_source"):
        out["cpu_source"] = None
    return out
