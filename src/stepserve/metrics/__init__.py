"""Metrics: per-request latencies, per-step batch accounting, run summaries, and the
alert rules (`stepserve doctor`). No torch: the standard library, prometheus_client
(parsing /metrics text, prometheus.py) and httpx (scraping a live server).

    percentiles.py      percentile (numpy's linear method), mean, least-squares slope
    request_metrics.py  RequestLatencies: TTFT, TPOT, ITL, E2E, queue time (vLLM's definitions)
    run_summary.py      RunSummary: one run's numbers as typed fields, JSON at the edges
    step_metrics.py     the step fields (slot utilisation, shares, queues, KV), TimeSeries
    summary.py          summarize / by_class / measure_run: requests and steps to a
                        RunSummary, the classes, time series and latency samples, once
    finding.py, rule.py, rules.py
                        Finding; a rule and its declared inputs; the rules and diagnose
    doctor.py           `stepserve doctor`'s job: the rules on a result file or a live server
"""

from stepserve.metrics.finding import Finding
from stepserve.metrics.percentiles import percentile
from stepserve.metrics.request_metrics import RequestLatencies, request_metrics
from stepserve.metrics.rules import RULES, diagnose
from stepserve.metrics.run_summary import RunSummary
from stepserve.metrics.step_metrics import TimeSeries, timeseries
from stepserve.metrics.summary import request_summary, summarize, summarize_by_class

__all__ = [
    "RULES", "Finding", "RequestLatencies", "RunSummary", "TimeSeries", "diagnose",
    "percentile", "request_metrics", "request_summary", "summarize", "summarize_by_class",
    "timeseries",
]
