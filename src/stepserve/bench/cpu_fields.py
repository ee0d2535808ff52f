"""A bench run's CPU sharing, as the RunSummary's cpu fields (the doctor's cpu_shared
rule reads them):

  cpu_others_cores: other processes' CPU seconds (normal priority) / wall seconds;
  cpu_wait_share: run-queue wait / (on CPU + wait) of the engine's threads;
  cpu_usable: usable cores; step_time_over_quiet: the steps' time over their shapes'
      quiet time (metrics/step_reference.py);
  cpu_source: where they were measured.

`bench --engine` measures its own process around the run (the engine's threads are
ours): "engine". Against a target, the target's /metrics over the run where it
publishes them (bench/scrape.py, metrics/cpu_window.py): "server"; else this machine,
around the run: "client", the client's threads and the others as seen from here (a
server on the same machine counts among the others), which the doctor does not read as
the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepserve.core.output import StepRecord
from stepserve.engine.cpu_share import CpuReading, CpuShare, CpuShareSampler
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_reference import step_time_over_quiet


class CpuWatch:
    """The sampler read when the run starts (`start`) and again for its fields."""

    def __init__(self, sampler: CpuShareSampler, start: CpuReading) -> None:
        self.sampler, self.start_reading = sampler, start

    @classmethod
    def start(cls, sampler: CpuShareSampler | None = None) -> CpuWatch:
        sampler = sampler or CpuShareSampler()
        return cls(sampler, sampler.read())

    def fields(self, source: str, steps: Sequence[StepRecord] = ()) -> RunSummary:
        """The cpu fields since `start` (none where the host says nothing)."""
        end = self.sampler.read()
        over = step_time_over_quiet(steps) if steps else None
        if not end.available:
            return RunSummary.of(step_time_over_quiet=over) if over is not None \
                else RunSummary()
        share = CpuShare.between(self.start_reading, end)
        return RunSummary.of(cpu_others_cores=share.others_cores,
                             cpu_wait_share=share.wait_share,
                             cpu_usable=float(share.usable_cpus),
                             step_time_over_quiet=over, cpu_source=source)


def cpu_row(s: RunSummary) -> str:
    """The cpu fields as one row of the bench table."""
    parts = [f"others {s.cpu_others_cores:.2f} of {s.cpu_usable or 0:g} cores"
             if s.cpu_others_cores is not None else "others -",
             f"waited {s.cpu_wait_share:.0%}" if s.cpu_wait_share is not None
             else "waited -"]
    if s.step_time_over_quiet is not None:
        parts.append(f"steps {s.step_time_over_quiet:.2f}x quiet")
    return ", ".join(parts)
