"""Metrics: per-request latencies, per-step batch accounting, run summaries, and the
alert rules (`stepserve doctor`). No torch: the standard library, prometheus_client
(parsing /metrics text) and httpx (scraping a live server)."""

from stepserve.metrics.percentiles import percentile
from stepserve.metrics.request_metrics import RequestLatencies, request_metrics
from stepserve.metrics.rules import RULES, Finding, diagnose
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import TimeSeries, timeseries
from stepserve.metrics.summary import request_summary, summarize, summarize_by_class

__all__ = [
    "RULES", "Finding", "RequestLatencies", "RunSummary", "TimeSeries", "diagnose",
    "percentile", "request_metrics", "request_summary", "summarize", "summarize_by_class",
    "timeseries",
]
