"""A sweep's options checked before any point runs: what a live server cannot take, and
the knee's metric and SLO limits (a typo there would be silently never met)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepserve.bench.http_run import check_url
from stepserve.config.errors import UsageError
from stepserve.metrics.summary import LATENCIES
from stepserve.metrics.summary_checks import allowed as metric_range
from stepserve.sweep.spec import WORKLOAD_AXES, Axis, parse_summary_slo

if TYPE_CHECKING:
    from stepserve.sweep.job import SweepOptions

DEFAULT_REQUESTS = 600


def check_live_sweep(options: SweepOptions, axes: list[Axis]) -> None:
    """ValueError for what a live server cannot take."""
    assert options.live is not None
    check_url(options.live.target)
    if options.configs:
        raise ValueError("--configs: a live server runs its own config; sweep configs on "
                         "the simulator, or start one server per config and sweep each")
    if options.scenario_runs is not None:
        raise ValueError("--scenario-runs: a live server runs its own config; with "
                         "--target the scenario gives only the workload")
    if options.pools:
        raise ValueError("--pools: a live server runs its own deployment; start it with "
                         "`stepserve serve --pools FILE` and sweep its load")
    if options.config.given and not options.predict:
        named = ", ".join(["--config"] * bool(options.config.config_file)
                          + sorted(options.config.settings))
        raise ValueError(f"{named}: engine settings cannot be changed on a live server; "
                         "restart it with them (`stepserve serve ...`)")
    fixed = [a.name for a in axes if a.name not in WORKLOAD_AXES]
    if fixed:
        raise ValueError(f"--vary {', '.join(fixed)}: a live server's settings cannot be "
                         f"varied; with --target vary only {', '.join(sorted(WORKLOAD_AXES))}")
    if not axes:
        raise ValueError("--target needs --vary rate=... (or concurrency=...): the load "
                         "is what a live sweep varies")
    warmup = options.live.warmup
    requests = options.requests or DEFAULT_REQUESTS
    if warmup < 0 or warmup >= requests:
        raise ValueError(f"--warmup {warmup}: must be >= 0 and below --requests "
                         f"({requests})")


def check_knee_options(options: SweepOptions) -> None:
    """The p99 metric names a latency the summaries have; each SLO limit is a value its
    metric can take (a NaN or negative latency would never be met, silently)."""
    latencies = [f"{name}_{stat}_s" for name in LATENCIES for stat in ("mean", "p50", "p95",
                                                                         "p99")]
    if options.p99_metric not in latencies:
        raise UsageError(f"--p99-metric {options.p99_metric!r}: unknown; allowed: "
                         f"{', '.join(latencies)}")
    for text in options.slo:
        try:
            slo = parse_summary_slo(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
        problem = metric_range(slo.metric).problem(f"--slo {slo.metric}: limit", slo.limit)
        if problem is not None:
            raise UsageError(problem)
