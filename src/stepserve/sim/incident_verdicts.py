"""What the lab says about each incident's fix, and about the quick start's claims: the
lines printed after a scenario's table (sim/table.py).

* promo spike: is the peak absorbed, and by how many replicas and which max_waiting, in
  the simulator (the fix's run) and by `stepserve plan capacity` (plan/capacity.py) on
  the same peak; they must agree.
* mixed pool: what the fix does to the chats, the summaries and the longest step.
* quick start: each of the three claims checked on the run (`CLAIMS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepserve.config.sizes import format_size
from stepserve.metrics.run_summary import RunSummary
from stepserve.plan.capacity import CapacityResult, capacity
from stepserve.sim.incidents import GATEWAY_S, late_timeouts, run_of
from stepserve.sim.run import SimulateResult
from stepserve.sim.scenarios import get_scenario

HEADROOM = 0.15  # the incident's "留 15%"


@dataclass(frozen=True)
class CapacityVerdict:
    plan: CapacityResult
    replicas: int  # the fix's run
    max_num_seqs: int
    max_waiting: int  # per replica
    rejected: int
    waiting_max: int  # over the pool

    @property
    def simulator_absorbs(self) -> bool:
        return self.rejected == 0

    @property
    def plan_absorbs(self) -> bool:
        p = self.plan
        return p.replicas <= self.replicas and self.max_num_seqs <= p.max_num_seqs and \
            p.queued_at_peak <= self.replicas * self.max_waiting

    @property
    def agree(self) -> bool:
        return self.simulator_absorbs == self.plan_absorbs


def capacity_verdict(result: SimulateResult) -> CapacityVerdict:
    """The fix's run against `plan capacity` on the peak that run had in flight (the
    load's own peak once capacity suffices; the before run's includes its backlog)."""
    after = run_of(result, "after")
    assert after.config is not None, "the fix's run carries its config"
    scenario = get_scenario("promo-spike")
    assert scenario.kv_cache_bytes and scenario.kv_bytes_per_token
    s, sc = after.summary, after.config.scheduler
    plan = capacity(scenario.kv_cache_bytes, scenario.kv_bytes_per_token, sc.max_model_len,
                    HEADROOM, int(s.in_engine_max or 1))
    return CapacityVerdict(plan, after.config.replicas, sc.max_num_seqs,
                           after.config.queue.max_waiting or 0,
                           int(s.requests_rejected or 0), int(s.waiting_max or 0))


def promo_lines(result: SimulateResult) -> list[str]:
    v = capacity_verdict(result)
    p = v.plan
    before, after = run_of(result, "before").summary, run_of(result, "after").summary
    said = "agree" if v.agree else "DISAGREE"
    absorbed = "the fix absorbs the peak" if v.simulator_absorbs else \
        "the fix does not absorb the peak"
    return [
        f"capacity at the peak ({p.peak_concurrency} in flight under the fix; the incident "
        "says 140):",
        f"  plan capacity: {format_size(p.kv_memory_bytes)} per replica / (max_len "
        f"{p.max_len:,} x {format_size(p.kv_bytes_per_token)}) = {p.seqs_per_replica} "
        f"sequences, max_num_seqs {p.max_num_seqs} at {HEADROOM:.0%} headroom, "
        f"{p.replicas} replicas, {p.queued_at_peak} waiting at the peak (max_waiting "
        f"{v.max_waiting} a replica: {v.replicas * v.max_waiting} over {v.replicas}); "
        f"{p.replicas_within_headroom} replicas would run the whole peak at once",
        f"  simulator, the fix ({v.replicas} x {v.max_num_seqs}, max_waiting "
        f"{v.max_waiting}): {v.rejected} of {after.requests_total:,.0f} rejected, waiting "
        f"peaked at {v.waiting_max}",
        f"  they {said}: {absorbed} with {v.replicas} replicas and max_waiting "
        f"{v.max_waiting} (`stepserve plan capacity --kv-memory "
        f"{format_size(p.kv_memory_bytes).replace(' ', '')} --kv-bytes-per-token "
        f"{format_size(p.kv_bytes_per_token).replace(' ', '')} --max-len {p.max_len} "
        f"--peak-concurrency {p.peak_concurrency}`)",
        f"the fix: TTFT P99 (gateway) {_s(before.ttft_p99_s, GATEWAY_S)} -> "
        f"{_s(after.ttft_p99_s, GATEWAY_S)}, first token over the deadline "
        f"{_pct(late_timeouts(result))} -> {_pct(late_timeouts(result, 'after'))}, E2E P99 "
        f"{_s(before.e2e_p99_s, GATEWAY_S)} -> {_s(after.e2e_p99_s, GATEWAY_S)}: the queue "
        "is gone; what remains of E2E P99 is the long answers' own writing time"]


def mixed_lines(result: SimulateResult) -> list[str]:
    b, a = run_of(result, "before"), run_of(result, "after")
    chat_b, chat_a = b.by_class["chat"], a.by_class["chat"]  # type: ignore[index]
    return [f"the fix: chat TTFT P99 {_s(chat_b.ttft_p99_s)} -> {_s(chat_a.ttft_p99_s)}, ITL "
            f"max {_s(b.summary.itl_max_s)} -> {_s(a.summary.itl_max_s)}, zero-decode steps "
            f"{_pct(b.summary.zero_decode_step_share)} -> "
            f"{_pct(a.summary.zero_decode_step_share)}: decode is never starved again; the "
            f"longest step is {_s(a.summary.step_max_s)}, not 0.4 s: the 2,048 cap is per "
            "request, and the chats that arrive with a summary's chunk share its step"]


@dataclass(frozen=True)
class Claim:
    """One of the quick start's claims, checked on a run of its three configs."""

    config: str
    says: str
    check: Callable[[dict[str, RunSummary]], tuple[bool, str]]


def _lowest(runs: dict[str, RunSummary], name: str, field: str, ms: bool = True
            ) -> tuple[bool, str]:
    values = {k: getattr(s, field) for k, s in runs.items()}
    shown = " / ".join(f"{k} {v * 1e3:.1f} ms" if ms else f"{k} {v:.2f}"
                       for k, v in values.items())
    return values[name] <= min(values.values()), f"{field} {shown}"


def _a_lowest(runs: dict[str, RunSummary]) -> tuple[bool, str]:
    results = [_lowest(runs, "A", f) for f in ("tpot_p50_s", "itl_p99_s")]
    return all(ok for ok, _ in results), "; ".join(text for _, text in results)


def _b_throughput_and_tail(runs: dict[str, RunSummary]) -> tuple[bool, str]:
    tput = {k: s.throughput_tokens_per_s or 0.0 for k, s in runs.items()}
    top = tput["B"] >= max(tput.values()) * 0.995  # all carry the load: within 0.5%
    worst = [max(runs, key=lambda k: getattr(runs[k], f) or 0.0) == "B"
             for f in ("itl_max_s", "tpot_p99_s", "e2e_p99_s")]
    shown = " / ".join(f"{k} {v:,.0f}" for k, v in tput.items())
    return top and all(worst), (f"tok/s {shown}; ITL max " + " / ".join(
        f"{k} {s.itl_max_s * 1e3:.0f} ms" for k, s in runs.items()))


def _itl_spread(s: RunSummary) -> float:
    return (s.itl_p99_s or 0.0) / (s.itl_p50_s or 1.0)


def _c_steadiest(runs: dict[str, RunSummary]) -> tuple[bool, str]:
    spread = {k: _itl_spread(s) for k, s in runs.items()}
    shown = " / ".join(f"{k} {v:.2f}" for k, v in spread.items())
    return spread["C"] <= min(spread.values()), f"ITL P99/P50 {shown}"


CLAIMS = (
    Claim("A", "lowest TPOT and ITL", _a_lowest),
    Claim("B", "highest throughput, worst tail", _b_throughput_and_tail),
    Claim("C", "steadiest ITL", _c_steadiest),
)


def quickstart_lines(result: SimulateResult) -> list[str]:
    runs = {r.name: r.summary for r in result.runs}
    if set(runs) != {"A", "B", "C"}:
        return []
    lines = ["the quick start's claims at this load:"]
    for claim in CLAIMS:
        ok, evidence = claim.check(runs)
        lines.append(f"  [{'holds' if ok else 'does not hold'}] {claim.config}: "
                     f"{claim.says}: {evidence}")
    return lines


VERDICTS: dict[str, Callable[[SimulateResult], list[str]]] = {
    "promo-spike": promo_lines, "mixed-pool": mixed_lines, "quickstart": quickstart_lines}


def format_verdict(result: SimulateResult) -> list[str]:
    """The lab's verdict for a scenario's runs; nothing where a run it needs is missing."""
    verdict = VERDICTS.get(result.scenario)
    try:
        return verdict(result) if verdict else []
    except (KeyError, TypeError):  # --runs left one out, or a class is missing
        return []


def _s(v: float | None, plus: float = 0.0) -> str:
    return "-" if v is None else f"{v + plus:.2f} s" if v + plus < 10 else f"{v + plus:.1f} s"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
