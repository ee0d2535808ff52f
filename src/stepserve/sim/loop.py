"""The discrete-event loop: drives each replica's engine core on one virtual clock. A
step begins at one event (schedule, cost model) and completes its duration later;
arrivals and aborts land in between, as on a real server. A closed loop issues its next
request the moment one ends; a session's later turn arrives its think time after the
turn before it ended (never, if that one did not complete). Each replica belongs to a
pool with its own config; the router picks a pool by the deployment's rules, then a
replica from each one's view of its load.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter, sub

from stepserve.config.settings import EngineConfig
from stepserve.core.clock import VirtualClock
from stepserve.core.decode_run import Sampler
from stepserve.core.engine_core import EngineCore, PendingStep
from stepserve.core.output import RunnerOutput, SchedulerOutput, StepRecord
from stepserve.core.request import Request, SamplingParams
from stepserve.routing.pools import Deployment, PoolRouter
from stepserve.routing.routers import ReplicaView, RouteRequest
from stepserve.sim.cost import CostModel
from stepserve.workload.sessions import next_turns, session_starts
from stepserve.workload.shared_prefix import prefix_token_ids
from stepserve.workload.spec import RequestSpec
from stepserve.workload.trace import TraceSpec, trace_token_ids

_REQUEST_ID = attrgetter("request_id")
SIM_EOS = 0
SIM_TOKEN = 1


class SimRunner:
    """Stands in for the model: a token for each sequence at its end, EOS at its
    workload's output length, and the step's time from a cost model."""

    reads_block_tables = False  # a cost model prices counts, never block ids

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        # request id -> the output tokens it holds when it samples EOS (its length - 1)
        self.eos_after: dict[str, int] = {}
        eos_after = self.eos_after
        # the same rule for a decode run: the steps before each request's EOS
        self.sampler = Sampler(SIM_TOKEN, SIM_EOS, lambda batch, held: list(
            map(sub, map(eos_after.__getitem__, map(_REQUEST_ID, batch)), held)))
        self.decode_step_time = cost_model.decode_step_time

    def register(self, request_id: str, output_len: int) -> None:
        self.eos_after[request_id] = output_len - 1

    def release(self, request_ids: list[str]) -> None:
        """Forget requests that ended (what `execute` does with finished_request_ids)."""
        for rid in request_ids:
            self.eos_after.pop(rid, None)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        eos_after = self.eos_after
        self.release(out.finished_request_ids)
        # one expression per request: this runs for every request in every step
        sampled: list[int | None] = [
            None if req.num_computed_tokens + n < req.num_prompt_tokens + (
                num_output := len(req.output_token_ids))
            else SIM_EOS if num_output >= eos_after[req.request_id]
            else SIM_TOKEN
            for req, n in zip(out.requests, out.num_scheduled_tokens)]
        return RunnerOutput(sampled, self.cost_model.step_time(out))


@dataclass(eq=False)
class Replica:
    index: int
    pool: str
    core: EngineCore
    runner: SimRunner
    steps: list[StepRecord] = field(default_factory=list)
    pending: PendingStep | None = None  # the step in flight
    wakeup_at: float | None = None
    in_run = False  # a decode run is in flight (its steps are already applied)
    run_straddles = False  # and its last step completes after the next event
    run_finished: list[Request] = field(default_factory=list)  # told when it completes

    def view(self) -> ReplicaView:
        snap = self.core.snapshot()
        return ReplicaView(self.index, self.pool, snap.num_queued, snap.num_running,
                           snap.kv_usage)


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


def make_request(spec: RequestSpec, arrival: float, history: list[int] | None = None
                 ) -> Request:
    """`history`: a later turn's conversation so far, its prompt's first ids."""
    params = _sim_params(spec.max_tokens, spec.priority, spec.tenant)
    ids = prompt_token_ids(spec) if history is None else history + [
        FIRST_PROMPT_ID + spec.index] + [1] * (spec.prompt_len - spec.history_len - 1)
    return Request(request_id=str(spec.index), prompt_token_ids=ids,
                   sampling_params=params, arrival_time=arrival, eos_token_id=SIM_EOS,
                   request_class=spec.request_class, length_estimate=spec.length_estimate)


@lru_cache(maxsize=4096)
def _sim_params(max_tokens: int, priority: int, tenant: str) -> SamplingParams:
    """One (unchanged) SamplingParams per (max_tokens, priority, tenant), checked once."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, priority=priority,
                          tenant=tenant)


# A simulated prompt is its own from its first token after any shared prefix (above any
# sampled id), so the prefix cache hits only what a real workload would.
FIRST_PROMPT_ID = 1 << 20


def prompt_token_ids(spec: RequestSpec) -> list[int]:
    """A simulated prompt's token ids (a trace's, as its block hashes say)."""
    if isinstance(spec, TraceSpec):
        return trace_token_ids(spec)
    ids = [1] * spec.prompt_len
    if spec.prefix is not None:
        ids[:spec.prefix_len] = prefix_token_ids(spec.prefix, spec.prefix_len)
    if spec.prefix_len < spec.prompt_len:
        ids[spec.prefix_len] = FIRST_PROMPT_ID + spec.index
    return ids


_STEP, _ARRIVAL, _WAKE, _RUN_END = 0, 1, 2, 3
MIN_RUN_STEPS = 2  # see _EventLoop.run_decodes


class _EventLoop:
    """One simulation's state: the event heap, the replicas, the closed loop's cursor."""

    def __init__(self, deployment: Deployment, specs: Sequence[RequestSpec],
                 cost_model: CostModel, num_gpu_blocks: int,
                 closed_loop_concurrency: int | None,
                 progress: Callable[[int], None] | None, decode_runs: bool = True) -> None:
        self.clock = VirtualClock()
        self.specs = specs
        self.replicas = []
        for i, pool in enumerate(deployment.replica_pools()):
            runner = SimRunner(cost_model.for_replica(i))
            blocks = pool.config.cache.num_gpu_blocks or num_gpu_blocks
            core = EngineCore(pool.config, runner, self.clock, blocks)
            self.replicas.append(Replica(i, pool.name, core, runner))
        self.router = PoolRouter(deployment)
        self.closed_loop = closed_loop_concurrency
        self.next_turn = next_turns(specs)  # a session's turn -> the one after it
        self.history: dict[int, list[int]] = {}  # a released turn -> its conversation so far
        self.turn_of: dict[str, int] = {}  # an issued session turn's request id -> its spec
        self.sessions_cut = self.turns_not_sent = 0
        self.reactive = bool(closed_loop_concurrency or self.next_turn)  # arrivals wait on ends
        # Decode runs need a cost model pricing decode steps from counts, and no hidden
        # outside event (several replicas: a closed loop may send one a request mid-run).
        self.decode_runs = decode_runs and cost_model.decode_step_time(1, 1) is not None \
            and (len(self.replicas) == 1 or not self.reactive)
        self.progress = progress
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, arg)
        self.seq = 0
        self.issued: list[Request] = []
        self.ended = 0  # requests (sessions) ended, not yet answered by a closed-loop issue
        self.starts = session_starts(specs) if self.next_turn else range(len(specs))
        if closed_loop_concurrency:
            first = min(closed_loop_concurrency, len(self.starts))
            for k in self.starts[:first]:
                self.push(0.0, _ARRIVAL, k)
            self.next_start = first
        else:
            for k in self.starts:
                self.push(specs[k].arrival_s, _ARRIVAL, k)
            self.next_start = len(self.starts)

    def push(self, t: float, kind: int, arg: int) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, arg))
        self.seq += 1

    def on_ended(self, requests: list[Request]) -> None:
        self.ended += len(requests)
        if self.turn_of:
            self.ended -= sum(map(self.release_next_turn, requests))
        if requests and self.progress is not None:
            self.progress(len(requests))

    def release_next_turn(self, req: Request) -> bool:
        """Schedule the next turn of `req`'s session if it completed; False: it ended."""
        k = self.turn_of.pop(req.request_id, None)
        nxt = self.next_turn.get(k) if k is not None else None
        if nxt is None:
            return False
        if req.finish_reason is None or not req.finish_reason.completed:
            self.sessions_cut += 1
            while nxt is not None:
                self.turns_not_sent += 1
                nxt = self.next_turn.get(nxt)
            return False
        self.history[nxt] = req.prompt_token_ids + req.output_token_ids
        end = req.finish_time if req.finish_time is not None else self.clock.now()
        self.push(max(end + self.specs[nxt].think_time_s, self.clock.now()), _ARRIVAL, nxt)
        return True

    def issue(self, k: int, t: float) -> Replica:
        spec = self.specs[k]
        req = make_request(spec, t, self.history.pop(k, None))
        self.issued.append(req)
        if k in self.next_turn:
            self.turn_of[req.request_id] = k
        route = RouteRequest(req.num_prompt_tokens, spec.max_tokens, spec.priority,
                             spec.tenant, prompt_token_ids=req.prompt_token_ids)
        rep = self.replicas[self.router.pick([r.view() for r in self.replicas], route)]
        if rep.core.add_request(req):
            rep.runner.register(req.request_id, spec.output_len)
        else:
            self.on_ended([req])  # refused at admission: it ended now
        return rep

    def kick(self, rep: Replica, t: float) -> None:
        """Begin the replica's next step (or decode run) if it is idle and has work."""
        if rep.pending is not None or rep.in_run or not rep.core.has_unfinished():
            return
        if self.decode_runs and rep.wakeup_at is None and self.run_decodes(rep, t):
            return
        pending = rep.core.begin_step()
        if pending.ran:
            rep.pending = pending
            self.push(t + pending.elapsed_s, _STEP, rep.index)
            return
        self.on_ended(rep.core.complete_step(pending).finished)  # e.g. queue timeouts
        wake = rep.core.next_wakeup_time()
        if wake is not None and rep.wakeup_at != wake:
            rep.wakeup_at = wake
            self.push(max(wake, t), _WAKE, rep.index)

    def run_decodes(self, rep: Replica, t: float) -> bool:
        """Do the replica's plain decode-only steps up to the next event at once; they
        complete at _RUN_END."""
        until = self.events[0][0] if self.events else math.inf
        # a run's setup passes over the batch several times: under MIN_RUN_STEPS (priced
        # at no context, so erring to runs) stepping is cheaper
        batch = rep.core.snapshot().num_running
        if until - t < MIN_RUN_STEPS * rep.runner.decode_step_time(batch, 0):
            return False
        run = rep.core.run_decodes(t, until, rep.runner.decode_step_time, rep.runner.sampler,
                                   stop_at_first_end=self.reactive, straddle=True)
        if run is None:
            return False
        rep.steps.extend(run.records)
        rep.runner.release(run.released_ids)
        rep.in_run, rep.run_finished = True, run.finished
        rep.run_straddles = run.straddles
        self.push(run.end_s, _RUN_END, rep.index)
        return True

    def run(self) -> None:
        events, replicas = self.events, self.replicas
        while events:
            t = events[0][0]
            self.clock.advance_to(t)
            touched: list[Replica] = []
            # Everything that happens at the same instant lands before any batch forms.
            while events and events[0][0] == t:
                _, _, kind, arg = heapq.heappop(events)
                if kind == _ARRIVAL:
                    touched.append(self.issue(arg, t))
                    continue
                rep = replicas[arg]
                if kind == _STEP:
                    pending, rep.pending = rep.pending, None
                    result = rep.core.complete_step(pending)
                    rep.steps.append(result.record)
                    self.on_ended(result.finished)
                elif kind == _RUN_END:
                    rep.in_run = False
                    if rep.run_straddles:  # what arrived while its last step ran
                        rep.steps[-1].num_waiting = rep.core.snapshot().num_waiting
                    self.on_ended(rep.run_finished)
                else:
                    rep.wakeup_at = None
                touched.append(rep)
            while touched:
                self.answer_closed_loop(touched, t)
                batch, touched = dict.fromkeys(touched), []
                for rep in batch:
                    self.kick(rep, t)
                if self.ended and self.closed_loop:
                    touched = [rep for rep in batch]  # timeouts in kick: answer them too

    def answer_closed_loop(self, touched: list[Replica], t: float) -> None:
        """A closed-loop client sends its next request the instant one ends."""
        while self.ended:
            self.ended -= 1
            if self.closed_loop and self.next_start < len(self.starts):
                touched.append(self.issue(self.starts[self.next_start], t))
                self.next_start += 1


def simulate(config: EngineConfig, specs: Sequence[RequestSpec], cost_model: CostModel,
             num_gpu_blocks: int, closed_loop_concurrency: int | None = None,
             progress: Callable[[int], None] | None = None,
             deployment: Deployment | None = None, decode_runs: bool = True) -> SimResult:
    """Every request and step of `specs` through the deployment's replicas (default:
    `config.replicas` alike); `decode_runs=False` steps one by one (same results)."""
    loop = _EventLoop(deployment or Deployment.single(config), specs, cost_model,
                      num_gpu_blocks, closed_loop_concurrency, progress, decode_runs)
    loop.run()
    for rep in loop.replicas:
        if rep.core.has_unfinished():
            raise RuntimeError(f"replica {rep.index} stopped with unfinished requests")
    return SimResult(requests=loop.issued, steps=[rep.steps for rep in loop.replicas],
                     duration_s=loop.clock.now(), num_gpu_blocks=num_gpu_blocks,
                     replicas=len(loop.replicas),
                     extra={"sessions_cut": loop.sessions_cut,
                            "turns_not_sent": loop.turns_not_sent} if loop.next_turn else {})
