"""The discrete-event loop: drives the real scheduler(s) on a virtual clock.

Events are request arrivals (open loop), step completions of each replica, and batch
window expiries (dynamic batching). A closed-loop workload issues its next request the
moment one ends, keeping `concurrency` in flight. All replicas share one clock; each
runs its own scheduler, KV cache and SimRunner behind a router.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stepserve.clock import VirtualClock
from stepserve.config import EngineConfig
from stepserve.core import make_scheduler
from stepserve.core.base import SchedulerBase
from stepserve.core.output import RunnerOutput, SchedulerOutput, StepRecord
from stepserve.request import Request, SamplingParams
from stepserve.sim.cost import CostModel
from stepserve.sim.router import make_router
from stepserve.sim.runner import SIM_EOS, SimRunner
from stepserve.workload.spec import RequestSpec


@dataclass(eq=False)
class Replica:
    index: int
    scheduler: SchedulerBase
    runner: SimRunner
    pending: SchedulerOutput | None = None  # the step in flight
    pending_result: RunnerOutput | None = None
    wakeup_at: float | None = None

    @property
    def outstanding(self) -> int:
        return len(self.scheduler.requests)


@dataclass
class SimResult:
    requests: list[Request]  # every request, in issue order
    steps: list[list[StepRecord]]  # per replica
    duration_s: float
    num_gpu_blocks: int
    replicas: int
    extra: dict = field(default_factory=dict)

    @property
    def all_steps(self) -> list[StepRecord]:
        return [s for per in self.steps for s in per]


def make_request(spec: RequestSpec, arrival: float) -> Request:
    params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0,
                            priority=spec.priority, tenant=spec.tenant)
    return Request(request_id=str(spec.index), prompt_token_ids=[1] * spec.prompt_len,
                   sampling_params=params, arrival_time=arrival, eos_token_id=SIM_EOS,
                   request_class=spec.request_class, length_estimate=spec.length_estimate)


_STEP, _ARRIVAL, _WAKE = 0, 1, 2


def simulate(config: EngineConfig, specs: Sequence[RequestSpec], cost_model: CostModel,
             num_gpu_blocks: int, closed_loop_concurrency: int | None = None,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Run `specs` through `config.replicas` replicas; returns every request and step."""
    clock = VirtualClock()
    replicas = [Replica(i, make_scheduler(config, clock, num_gpu_blocks), SimRunner(cost_model))
                for i in range(config.replicas)]
    router = make_router(config.router)
    events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, replica or spec idx)
    seq = 0
    issued: list[Request] = []
    ended_count = [0] * len(replicas)  # finished list lengths already seen

    def push(t: float, kind: int, arg: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, arg))
        seq += 1

    next_spec = 0
    if closed_loop_concurrency:
        first = min(closed_loop_concurrency, len(specs))
        for k in range(first):
            push(0.0, _ARRIVAL, k)
        next_spec = first
    else:
        for k, spec in enumerate(specs):
            push(spec.arrival_s, _ARRIVAL, k)
        next_spec = len(specs)

    def kick(rep: Replica, t: float) -> None:
        """Start the replica's next step if it is idle and has work."""
        if rep.pending is not None:
            return
        sched = rep.scheduler
        if not sched.has_unfinished():
            return
        out = sched.schedule()
        if out.is_empty:
            wake = sched.next_wakeup_time()
            if wake is not None and rep.wakeup_at != wake:
                rep.wakeup_at = wake
                push(max(wake, t), _WAKE, rep.index)
            return
        result = rep.runner.execute(out)
        rep.pending, rep.pending_result = out, result
        push(t + result.elapsed_s, _STEP, rep.index)

    def collect_ended(rep: Replica, t: float) -> int:
        """Forget ended requests in the runner; return how many ended since last time."""
        fin = rep.scheduler.finished
        new = fin[ended_count[rep.index]:]
        ended_count[rep.index] = len(fin)
        for r in new:
            rep.runner.forget(r.request_id)
        return len(new)

    def issue(k: int, t: float) -> Replica:
        spec = specs[k]
        req = make_request(spec, t)
        issued.append(req)
        rep = replicas[router.pick(replicas)]
        rep.runner.register(req.request_id, spec.output_len)
        rep.scheduler.add_request(req)
        return rep

    while events:
        t = events[0][0]
        clock.advance_to(t)
        touched: list[Replica] = []
        # Everything that happens at the same instant lands before any batch forms.
        while events and events[0][0] == t:
            _, _, kind, arg = heapq.heappop(events)
            if kind == _ARRIVAL:
                touched.append(issue(arg, t))
                continue
            rep = replicas[arg]
            if kind == _STEP:
                out, result = rep.pending, rep.pending_result
                rep.pending = rep.pending_result = None
                rep.scheduler.update_from_output(out, result)
            else:
                rep.wakeup_at = None
            touched.append(rep)
        # Closed loop: a client sends its next request the instant one ends (even a
        # rejected one), before any replica forms its next batch.
        k = 0
        while k < len(touched):
            ended = collect_ended(touched[k], t)
            if ended and progress is not None:
                progress(ended)
            if closed_loop_concurrency:
                for _ in range(ended):
                    if next_spec < len(specs):
                        touched.append(issue(next_spec, t))
                        next_spec += 1
            k += 1
        for rep in dict.fromkeys(touched):
            kick(rep, t)
    for rep in replicas:
        if rep.scheduler.has_unfinished():
            raise RuntimeError(f"replica {rep.index} stopped with unfinished requests")
    return SimResult(requests=issued,
                     steps=[rep.scheduler.step_records for rep in replicas],
                     duration_s=clock.now(), num_gpu_blocks=num_gpu_blocks,
                     replicas=len(replicas))
