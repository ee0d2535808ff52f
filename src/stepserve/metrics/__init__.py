"""Metrics: per-request latencies, per-step batch accounting, run summaries, and the
seed's alert rules (`stepserve doctor`). Standard library only.

    percentiles.py      percentile (numpy's linear method), mean, least-squares slope
    request_metrics.py  RequestMetrics: TTFT, TPOT, ITL, E2E, queue time (vLLM's definitions)
    step_metrics.py     step-level keys (slot utilisation, shares, queues, KV), timeseries
    summary.py          summarize / summarize_by_class: one run as a JSON-able dict
    alerts.py           Finding, the rules, diagnose
    doctor_cmd.py       the `doctor` subcommand
"""

from stepserve.metrics.alerts import RULES, Finding, diagnose
from stepserve.metrics.percentiles import percentile
from stepserve.metrics.request_metrics import RequestMetrics, request_metrics
from stepserve.metrics.step_metrics import TimeSeries, timeseries
from stepserve.metrics.summary import request_summary, summarize, summarize_by_class

__all__ = [
    "RULES", "Finding", "RequestMetrics", "TimeSeries", "diagnose", "percentile",
    "request_metrics", "request_summary", "summarize", "summarize_by_class", "timeseries",
]
