"""Whether the server shares its CPU, on /metrics (read at scrape time; the engine
thread only adds each step's time to the quiet reference):

* `cpu_runqueue_wait_seconds_total`: this process's threads' time waiting on a run
  queue for a core; `cpu_on_cpu_seconds_total`: their time on one (the wait's share of
  the two, over a window, is how much of their time the threads waited);
* `cpu_others_seconds_total`: CPU seconds of other processes at normal priority (over a
  window, divided by its length: the cores they took); `cpu_steal_seconds_total`: what a
  hypervisor took;
* `cpu_usable`: the cores this process may run on;
* `step_time_over_quiet`: the recent steps' time over their shapes' quiet time
  (metrics/step_reference.py), absent until a shape has a reference;
* `step_threads`: the CPU threads the engine's steps run on now, and
  `step_threads_changes_total` how often that count changed (engine/step_threads.py;
  absent until the engine is watched).

All counters since the server started (engine/cpu_share.py). Where the host does not
say (not Linux, no schedstat), the series it cannot read are absent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepserve.core.output import StepRecord
from stepserve.engine.cpu_share import CpuShareSampler
from stepserve.engine.step_threads import StepThreads
from stepserve.metrics.step_reference import QuietStepReference

P = "stepserve:"
COUNTERS = (
    ("cpu_runqueue_wait_seconds", "runqueue_wait_s",
     "this process's threads' time waiting on a run queue for a core"),
    ("cpu_on_cpu_seconds", "on_cpu_s", "this process's threads' time on a core"),
    ("cpu_others_seconds", "others_s",
     "CPU time of other processes at normal (or higher) priority"),
    ("cpu_steal_seconds", "steal_s", "CPU time a hypervisor took (steal)"),
)


class CpuMetrics:
    """One app's CPU-sharing series (labels `labels`, values `label_values`)."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 label_values: tuple[str, ...],
                 sampler: CpuShareSampler | None = None) -> None:
        self.labels = labels
        self.label_values = list(label_values)
        self.sampler = sampler or CpuShareSampler()
        self.sampler.read()  # the counters count from here
        self.reference = QuietStepReference()
        self._threads: StepThreads | None = None
        registry.register(self)

    def watch(self, threads: StepThreads) -> None:
        """Report the engine's thread policy (its current choice, read at scrape time)."""
        self._threads = threads

    def on_steps(self, records: Sequence[StepRecord]) -> None:
        for r in records:
            self.reference.add(r)

    def collect(self) -> Iterator[Metric]:
        reading = self.sampler.read()
        for name, attr, doc in COUNTERS:
            value = getattr(reading, attr)
            if value is not None:
                family = CounterMetricFamily(P + name, doc, labels=self.labels)
                family.add_metric(self.label_values, value)
                yield family
        gauges = [("cpu_usable", "CPUs this process may run on", reading.usable_cpus)]
        if self._threads is not None:
            gauges.append(("step_threads", "CPU threads the engine's steps run on now",
                           self._threads.choice.threads))
            family = CounterMetricFamily(P + "step_threads_changes",
                                         "changes of the steps' thread count",
                                         labels=self.labels)
            family.add_metric(self.label_values, self._threads.choice.changes)
            yield family
        if (over := self.reference.over_quiet()) is not None:
            gauges.append(("step_time_over_quiet", "recent step time over the quiet time "
                           "of the same step shapes", over))
        for name, doc, value in gauges:
            family = GaugeMetricFamily(P + name, doc, labels=self.labels)
            family.add_metric(self.label_values, value)
            yield family

    def describe(self) -> list[Metric]:
        """The names, for the registry's clash check."""
        return [*(CounterMetricFamily(P + name, "") for name, _, _ in COUNTERS),
                GaugeMetricFamily(P + "cpu_usable", ""),
                GaugeMetricFamily(P + "step_threads", ""),
                CounterMetricFamily(P + "step_threads_changes", ""),
                GaugeMetricFamily(P + "step_time_over_quiet", "")]
