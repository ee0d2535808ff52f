"""`stepserve report`'s job: a sweep, simulate or bench result file as an HTML page with
PNG plots. matplotlib is imported only when a report is written, so the other commands
do not need it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepserve.bench.results import BenchResult
from stepserve.bench.vllm_result import bench_result_from_vllm
from stepserve.config.errors import UsageError
from stepserve.config.user_files import check_output_dir, load_json
from stepserve.metrics.vllm_summary import is_vllm_result
from stepserve.sim.run import SimulateResult
from stepserve.sweep.result import KIND, SweepResult


@dataclass(frozen=True)
class ReportOptions:
    result: str  # the JSON result file
    out: str  # the folder for index.html and the PNGs


def run_report(options: ReportOptions) -> int:
    """Check the result, write the report, say where; the exit status."""
    check_output_dir("--out", options.out)  # before reading and plotting
    result = load_json(options.result, "result file")
    if not is_vllm_result(result):  # a flat vLLM result is one run: load_result reads it
        _check_runs(result, options.result)
    from stepserve.sweep.report import write_report

    try:
        page = write_report(load_result(result, options.result), options.out)
    except UsageError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a run missing what the plots read
        raise UsageError(f"{options.result}: not a result this report can read "
                         f"({type(e).__name__}: {e})") from None
    except OSError as e:  # the disk filled up, or the folder went away meanwhile
        raise UsageError(f"--out {options.out!r}: cannot write the report ({e})") from None
    print(f"wrote {page}")
    return 0


def _check_runs(result: Any, where: str) -> None:
    if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
        raise UsageError(f"{where}: not a sweep, simulate, bench or vLLM bench result (no "
                         "runs list, no vLLM result keys)")
    if not result["runs"]:
        raise UsageError(f"{where}: the result has no runs: nothing to plot")
    for i, run in enumerate(result["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("summary"), dict):
            raise UsageError(f"{where}: runs[{i}] is not a run (an object with a "
                             "\"summary\" object)")


def load_result(data: Mapping[str, Any], where: str
                ) -> SimulateResult | SweepResult | BenchResult:
    """A result file of any version as its type: a sweep names its kind, a bench run its
    target, a `vllm bench serve --save-result` file its flat keys; anything else with
    runs is read as a simulate result."""
    if is_vllm_result(data):
        return bench_result_from_vllm(data, Path(where).stem)
    if data.get("kind") == KIND:
        return SweepResult.from_json(data, where)
    runs = data["runs"]
    if runs and all("target" in r for r in runs):
        return BenchResult.from_json(data, where)
    return SimulateResult.from_json(data, where)
