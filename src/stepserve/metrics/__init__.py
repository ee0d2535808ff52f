"""Metrics: per-request latencies, per-step batch accounting, run summaries, and the
seed's alert rules (`stepserve doctor`). Standard library only.

    percentiles.py      percentile (numpy's linear method), mean, least-squares slope
    request_metrics.py  RequestLatencies: TTFT, TPOT, ITL, E2E, queue time (vLLM's definitions)
    step_metrics.py     step-level keys (slot utilisation, shares, queues, KV), timeseries
    summary.py          summarize / summarize_by_class: one run as a JSON-able dict
    alerts.py           Finding, the rules, diagnose
    doctor.py           `stepserve doctor`'s job: the rules on a result file or a live server
"""

from stepserve.metrics.alerts import RULES, Finding, diagnose
from stepserve.metrics.percentiles import percentile
from stepserve.metrics.request_metrics import RequestLatencies, request_metrics
from stepserve.metrics.step_metrics import TimeSeries, timeseries
from stepserve.metrics.summary import request_summary, summarize, summarize_by_class

__all__ = [
    "RULES", "Finding", "RequestLatencies", "TimeSeries", "diagnose", "percentile",
    "request_metrics", "request_summary", "summarize", "summarize_by_class", "timeseries",
]
