"""`stepserve sweep --target URL --predict cost.json`: the live sweep's points run again in
the simulator with a calibrated cost model, as a second series ("predicted") beside the
measured one, so the knee, the recommendation and the report's plot show both, and the
text says whether they agree (the same point, or one grid step apart).

The prediction runs the same requests (the same workload, seed and load per point) on
the settings the server runs with: the engine settings given on the command line (which,
with --predict, describe the server rather than change it), with the scheduler settings
the server publishes on /metrics laid over them, and the KV pool the cost file records
for this machine (`stepserve serve`'s default). A live point's warm-up requests are
left out of its metrics; the prediction counts every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stepserve.config.settings import EngineConfig
from stepserve.sim.cost_options import CostModelOptions, cost_setup_for
from stepserve.sim.run import run_config
from stepserve.sweep.knee import KneeResult
from stepserve.sweep.result import SweepCoords, SweepPointResult
from stepserve.sweep.spec import SweepPoint
from stepserve.workload.overrides import WorkloadOverrides
from stepserve.workload.spec import Workload

PREDICTED = "predicted"
# the scheduler settings a stepserve server publishes (scheduler_config_info)
PUBLISHED = ("batching", "max_num_seqs", "max_num_batched_tokens",
             "long_prefill_token_threshold", "max_num_partial_prefills", "budget_order")


def server_config(base: EngineConfig, published: Mapping[str, Any]) -> EngineConfig:
    """`base` with the settings the server published laid over it."""
    given = {k: published[k] for k in PUBLISHED if published.get(k) not in (None, "")}
    return base.replace(**given) if given else base


def predict_points(cost_file: str, base: EngineConfig, points: Sequence[SweepPoint],
                   measured: Sequence[SweepPointResult],
                   make_workload: Callable[[WorkloadOverrides], Workload],
                   log: Callable[[str], None] | None = None) -> list[SweepPointResult]:
    """The measured points again on the simulator, one per point measured."""
    published = next((r.result.config for r in measured if getattr(r.result, "config", None)),
                     None) or {}
    config = server_config(base, published)
    setup = cost_setup_for(CostModelOptions(cost=cost_file))
    blocks = setup.num_gpu_blocks(config)
    out = []
    for p in points[:len(measured)]:
        workload = make_workload(p.workload_overrides)
        run = run_config(f"{PREDICTED} {p.label}", config, workload.generate(),
                         setup.cost_model, blocks, workload.closed_loop_concurrency)
        out.append(SweepPointResult(run, SweepCoords(PREDICTED, PREDICTED, p.x, p.values)))
        if log:
            s = run.summary
            log(f"predicted {p.label}: {s.throughput_tokens_per_s or 0:.0f} tok/s, "
                f"ttft P99 {s.ttft_p99_s or 0:.2f} s")
    return out


def agreement(knees: Sequence[KneeResult]) -> str | None:
    """One line: where the measured and the predicted series recommend, and whether that
    is the same operating point (within one grid step); None without both."""
    predicted = next((k for k in knees if k.series == PREDICTED), None)
    measured = next((k for k in knees if k.series != PREDICTED), None)
    if predicted is None or measured is None:
        return None
    m, p = measured.recommended_index, predicted.recommended_index
    if m is None or p is None:
        return "measured vs predicted: one of them recommends no point"
    apart = abs(m - p)
    verdict = "the same point" if apart == 0 else \
        "within one grid step" if apart == 1 else f"{apart} grid steps apart"
    return (f"measured recommends {measured.xs[m]}, predicted {predicted.xs[p]}: {verdict}"
            f" (knee measured {measured.knee_x}, predicted {predicted.knee_x})")
