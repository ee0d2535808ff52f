"""The host's rule: the CPU is shared. When other processes compete for the engine's
cores, its steps slow down far more than the share of CPU they take explains (on 2
cores one busy loop beside the engine took a batch-1 decode step from 12 ms to a median
of 29-36 ms and a P90 of 120-150 ms: each OpenMP thread waits on the run queue for its
turn, and the others wait for the slowest). Users then blame the scheduler's settings.

Lines: other processes at normal priority used 0.25 cores or more on average (a quarter
of a core taken from a 2-core engine already shows in the tail), or the engine's threads
waited 10% or more of their time for a core. A window in which the engine ran no step
(an idle server) is left alone: sharing an idle CPU costs nothing.

It reads the summary's cpu fields, which the host's readings fill (host/cpu_share.py's
CpuShare.fields: a bench run's own process, or a server's /metrics read back).

Readings from the bench client's own machine (`cpu_source` "client": the target had no
such series) are not the engine's, and the client's machine may hold the server itself,
whose CPU would count as the others': the rule does not read them.

It is no member of RULES (a run's own rules: a simulation feeds them all) but of the
host: `first_if_cpu_shared` puts its finding first and tells every latency finding that
the scheduler's settings may not be its cause.
"""

from __future__ import annotations

from dataclasses import replace

from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import RuleSettings, S, rule
from stepserve.metrics.run_summary import RunSummary

OTHERS_CORES_MIN = 0.25  # other processes' CPU, in cores, averaged over the run
WAIT_SHARE_MIN = 0.10  # of the engine threads' time, spent waiting for a core
CPU_SHARED = "cpu_shared"
# the rules whose findings are about time (latency, queues, steps), which a shared CPU
# slows whatever the settings
LATENCY_RULES = frozenset({
    "capacity", "queue_growing", "running_below_offered", "prefill_stalls_decode",
    "tail_ttft_from_prefill", "tpot_tail", "throughput_over_experience", "timeouts",
})
NOT_THE_SCHEDULER = "the scheduler's settings are not the cause"


@rule((S.cpu_others_cores, S.cpu_wait_share))
def cpu_shared(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    if s.cpu_source == "client" or s.steps == 0:
        return None
    others, wait = s.cpu_others_cores, s.cpu_wait_share
    crowded = others is not None and others >= OTHERS_CORES_MIN
    waited = wait is not None and wait >= WAIT_SHARE_MIN
    if not (crowded or waited):
        return None
    seen = []
    if others is not None:
        of = f" of {s.cpu_usable:g} cores" if s.cpu_usable else ""
        seen.append(f"other processes used {others:.2f}{of}")
    if wait is not None:
        seen.append(f"the engine's threads waited {wait:.0%} of their time for a core")
    if s.step_time_over_quiet is not None:
        seen.append(f"steps took {s.step_time_over_quiet:.1f}x their quiet time")
    return Finding(
        CPU_SHARED, "warning",
        f"the CPU is shared: {'; '.join(seen)} (alert at {OTHERS_CORES_MIN:g} cores or "
        f"{WAIT_SHARE_MIN:.0%} waiting); every step waits for the other work, so latency "
        "and throughput say little about the engine's settings",
        "move the other work off these cores, or pin them apart (taskset); the engine "
        "already steps on fewer threads while other work keeps whole cores busy, and "
        f"--threads N fixes the count; {NOT_THE_SCHEDULER}")


def first_if_cpu_shared(summary: RunSummary, settings: RuleSettings,
                        found: list[Finding]) -> list[Finding]:
    """`found` (the run's own findings) with the shared CPU's finding first where it
    fires, each latency finding's action then saying to fix that first."""
    shared = cpu_shared(summary, settings)
    if shared is None:
        return found
    caveat = ("; but first: the CPU was shared over this run (cpu_shared), which slows "
              "every step whatever the settings: fix that before changing them")
    return [shared, *(replace(f, action=f.action + caveat) if f.rule in LATENCY_RULES
                      else f for f in found)]
