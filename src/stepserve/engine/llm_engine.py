"""LLMEngine: the real engine: a torch runner under the engine core (core/engine_core.py),
the simulator's scheduler, KV block manager and step records, plus the text around it:
tokenizing prompts, and the output processor (outputs.py: detokenizing, stop strings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.core.base import SchedulerBase
from stepserve.core.clock import Clock, WallClock
from stepserve.core.engine_core import EngineCore
from stepserve.core.output import StepRecord, StepResult
from stepserve.core.request import Request, RequestStatus, SamplingParams, child_params
from stepserve.core.request_limits import (
    DEFAULT_MAX_LOGPROBS,
    cache_salt_refusal,
    check_text,
    priority_refusal,
    stop_tokens_refusal,
)
from stepserve.engine.outputs import End, OutputProcessor, Outputs, RequestOutput
from stepserve.engine.seam import InvalidRequest, StreamOutput
from stepserve.host.step_budget import (
    cpu_step_budget,
    hardware_base,
    prefill_params,
    runner_hardware,
)
from stepserve.host.step_threads import follow_free_cores

log = logging.getLogger("stepserve.engine")


class LLMEngine:
    def __init__(self, model: str | Path = "default",
                 config: EngineConfig | ConfigOverrides | None = None, *,
                 dtype: str = "float32", device: str = "cpu", clock: Clock | None = None,
                 runner=None, strict_max_model_len: bool = False,
                 quantization: str | None = "auto", tokenizer: str | Path | None = None,
                 max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
        """`config`: a complete EngineConfig is used as it is; settings (ConfigOverrides,
        or None for none) are applied on the hardware's scheduling defaults. `runner`: an
        already loaded TorchRunner (its weights and KV store) to reuse, under a fresh KV
        block manager. `strict_max_model_len`: the user chose it (see _settings_for_runner).
        `quantization`: the weight mode (model/modes.py). `tokenizer`: a folder holding
        the tokenizer (default: the model's). `max_logprobs`: the most logprobs a request
        may ask for per token (vLLM's --max-logprobs; -1: the vocabulary)."""
        from stepserve.model.runner import TorchRunner  # torch only when a model runs

        overrides = ConfigOverrides() if config is None else config
        if isinstance(overrides, ConfigOverrides):
            config = overrides.apply()  # the user's settings on the plain defaults
        else:
            overrides = None
        assert isinstance(config, EngineConfig)
        if config.replicas > 1:  # one engine here; replicas run on Ray Serve (cluster/)
            raise ValueError(
                f"replicas = {config.replicas}: LLM and LLMEngine run one engine in this "
                f"process; serve replicas with `stepserve serve --replicas {config.replicas}` "
                "(Ray Serve: pip install -e '.[cluster]')")
        if runner is None:
            runner = TorchRunner.from_config(model, config.cache, dtype=dtype, device=device,
                                             quantization=quantization, tokenizer=tokenizer)
        self.runner = runner
        self.max_logprobs = runner.args.vocab_size if max_logprobs == -1 else max_logprobs
        self.config = config = _settings_for_runner(config, overrides, runner,
                                                    strict_max_model_len)
        self.step_threads = follow_free_cores(runner, config.threads)
        self.clock = clock or WallClock()
        self.core = EngineCore(config, runner, self.clock, runner.num_gpu_blocks)
        self.tokenizer = runner.tokenizer
        self.output = OutputProcessor(self.tokenizer)
        self._counter = 0

    @property
    def scheduler(self) -> SchedulerBase:
        """The core's scheduler, for tests that look inside; a driver reads
        `core.snapshot()` and ends requests through `core.finish_request`."""
        return self.core.scheduler

    # ---- requests ----
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None
                    ) -> Request:
        """Queue a prompt (text or token ids) with n = 1 (`add_parallel` takes any n). A
        request the scheduler rejects comes back already finished, with status
        FINISHED_REJECTED and the reason in finish_message (and is in no StepResult)."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError(f"n = {params.n}: add_request queues one sequence; use "
                             "add_parallel for n > 1")
        (request,) = self.add_parallel(prompt, params, request_id, arrival_time)
        return request

    def add_parallel(self, prompt: str | list[int], params: SamplingParams | None = None,
                     request_id: str | None = None, arrival_time: float | None = None,
                     streamed: bool = False, cache_salt: str | None = None
                     ) -> list[Request]:
        """Queue a prompt as `params.n` sequences, as vLLM V1 does: n child requests of the
        same prompt with their own KV (ids `"{i}_{request_id}"`, `child_params` seeds);
        n = 1 is the request itself. Returns the children in index order; if admission
        refused one, the ones before it are aborted and only the refused one (finished)
        comes back. `cache_salt`: the prefix cache's namespace (vLLM's). `streamed`: the
        step's outputs carry each sequence's new text as it comes (else only its final)."""
        params = params or SamplingParams()
        self._check(prompt, params, cache_salt)
        if request_id is None:
            request_id = f"req-{self._counter}"
            self._counter += 1
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        arrival = self.clock.now() if arrival_time is None else arrival_time
        eos = self.runner.eos_token_id
        if params.n == 1:
            requests = [Request(request_id, ids, params, arrival_time=arrival,
                                eos_token_id=eos, cache_salt=cache_salt)]
        else:
            requests = [Request(f"{k}_{request_id}", list(ids), child_params(params, k),
                                arrival_time=arrival, eos_token_id=eos,
                                parent_id=request_id, index=k, cache_salt=cache_salt)
                        for k in range(params.n)]
        for k, request in enumerate(requests):
            if not self.core.add_request(request):
                for taken in requests[:k]:
                    self.core.abort_request(taken.request_id, "a sibling was refused")
                return [request]
            self.output.add(request, streamed)
        return requests

    def _check(self, prompt: str | list[int], params: SamplingParams,
               cache_salt: str | None) -> None:
        """The one check of a request against what this engine can take
        (request_limits.py says why), offline and served alike: InvalidRequest naming the
        field, as the server's 400 does. (Its length is admission's.)"""
        vocab, eos = self.runner.args.vocab_size, self.runner.eos_token_id
        if isinstance(prompt, str):
            refusal = check_text("prompt", prompt)
        else:
            bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
            refusal = bad and f"prompt token ids must be integers in [0, {vocab}); got " \
                f"{bad[:5]}"
        if refusal:
            raise InvalidRequest(refusal, "prompt")
        if refusal := cache_salt_refusal(cache_salt):
            raise InvalidRequest(refusal, "cache_salt")
        if refusal := stop_tokens_refusal(params.stop_token_ids, params.min_tokens, vocab,
                                          eos):
            raise InvalidRequest(refusal, "stop_token_ids")
        if refusal := priority_refusal(params.priority, self.config.scheduler.policy):
            raise InvalidRequest(refusal, "priority", "unsupported_value")
        for what, param, asked in (("sample", "logprobs", params.logprobs),
                                   ("prompt", "prompt_logprobs", params.prompt_logprobs)):
            if asked is not None and asked > self.max_logprobs:  # vLLM's words
                raise InvalidRequest(f"Requested {what} logprobs of {asked}, which is greater "
                                     f"than max allowed: {self.max_logprobs}", param)

    def abort_request(self, request_id: str, message: str = "aborted by the client") -> bool:
        """End a live request; a parent's id (n > 1) ends every child still running."""
        return any([self.core.abort_request(rid, message)
                    for rid in self.output.sequence_ids(request_id)])

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    # ---- the loop ----
    def step(self) -> EngineStep:
        """One engine step (core/engine_core.py): what ran, who got a token, who ended,
        and the outputs of the sequences that have news (outputs.py). The ends
        the new text decides (stop strings) are this step's: the core ends them, and a
        step that runs nothing (`complete_step` of an empty one) takes them."""
        result = self.core.step()
        finished = result.finished
        if ends := self.output.add_tokens(result.emitted):
            self._apply(ends)
            finished = finished + self.core.take_finished()
        outputs, ends = self.output.process(result.emitted, finished)
        self._apply(ends)
        return EngineStep(result.record, result.emitted, finished, outputs)

    def _apply(self, ends: list[End]) -> None:
        for end in ends:
            self.core.finish_request(end.request_id, end.status, end.message,
                                     stop_reason=end.stop_reason)

    def fail_all(self, message: str) -> Outputs:
        """The loop over this engine cannot go on: end every live sequence as an error
        (as far as the core still can) and return their final outputs."""
        outputs = self.output.fail_all(message)
        for req, _ in outputs:
            try:
                self.core.finish_request(req.request_id, RequestStatus.FINISHED_ERROR, message)
            except Exception:  # the core itself is broken: the answer is what matters
                log.exception("ending request %s failed", req.request_id)
        return outputs

    def run_until_done(self, on_step: Callable[[EngineStep], None] | None = None
                       ) -> dict[str, StreamOutput]:
        """Step until nothing is left; `on_step` sees every result. Returns every
        sequence's final output, by its request id."""
        finals: dict[str, StreamOutput] = {}
        while self.has_unfinished():
            result = self.step()
            finals.update((req.request_id, out) for req, out in result.outputs if out.finished)
            if on_step is not None:
                on_step(result)
        return finals

    # ---- results ----
    def output_of(self, group: Request | Sequence[Request],
                  finals: dict[str, StreamOutput], prompt: str | None = None
                  ) -> RequestOutput:
        """One request's output in vLLM's shape from its sequences' final outputs; the
        children of an n > 1 request (in index order) make one output with n
        completions."""
        group = [group] if isinstance(group, Request) else list(group)
        return RequestOutput.of(group, [finals[r.request_id] for r in group], prompt,
                                lambda t: self.tokenizer.decode([t], skip_special_tokens=False))


@dataclass(frozen=True, slots=True)
class EngineStep(StepResult):
    """The core's StepResult and what the output processor made of it."""

    outputs: Outputs = field(default_factory=list)


def _settings_for_runner(config: EngineConfig, overrides: ConfigOverrides | None, runner,
                         strict_max_model_len: bool) -> EngineConfig:
    """An engine's settings once its model is loaded. `config`: the settings as applied on
    the plain defaults; `overrides`: the user's settings, applied again on the hardware's
    scheduling defaults (None: `config` is complete and used as it is). A max_model_len
    beyond the model's is lowered to it, or with `strict_max_model_len` refused
    (ConfigError); the CPU block pool is the one the runner sized (from swap_space)."""
    if overrides is not None:
        budget = cpu_step_budget(runner_hardware(runner), prefill_params(runner.args))
        config = overrides.apply(hardware_base(budget, config))
        if budget is not None:
            log.info("CPU scheduling defaults: %s", budget.describe())
    limit = runner.args.max_position_embeddings
    if limit and config.scheduler.max_model_len > limit:
        if strict_max_model_len:
            raise ConfigError(
                f"max_model_len = {config.scheduler.max_model_len} is more than the model "
                f"allows: {limit} (max_position_embeddings in its config.json); lower "
                "max_model_len (--max-model-len)")
        config = config.replace(max_model_len=limit)  # the model cannot go further
    if runner.num_cpu_blocks != config.cache.num_cpu_blocks:
        config = config.replace(num_cpu_blocks=runner.num_cpu_blocks, swap_space=0.0)
    return config


@dataclass
class ClosedLoopResult:
    requests: list[Request]  # every request, in issue order
    steps: list[StepRecord]  # every step that ran
    duration_s: float


def run_closed_loop(engine: LLMEngine, jobs: Sequence[tuple[list[int], SamplingParams]],
                    concurrency: int, request_class: Callable[[int], str] | None = None
                    ) -> ClosedLoopResult:
    """Run every (prompt ids, params) job with `concurrency` in flight, the way a batch job
    drives a server (the next one sent the moment one ends); returns every request (in
    issue order), the steps, and the wall time from the first issue to the last end."""
    start = engine.clock.now()
    issued: list[Request] = []
    steps: list[StepRecord] = []

    def issue_one() -> None:
        """Send the next job; one refused at admission ends at once: send another."""
        while len(issued) < len(jobs):
            k = len(issued)
            ids, params = jobs[k]
            req = engine.add_request(ids, params, request_id=f"job-{k}")
            if request_class is not None:
                req.request_class = request_class(k)
            issued.append(req)
            if not req.is_finished:
                return

    def on_step(result: EngineStep) -> None:
        if result.ran:
            steps.append(result.record)
        for _ in result.finished:
            issue_one()

    for _ in range(min(concurrency, len(jobs))):
        issue_one()
    engine.run_until_done(on_step)
    return ClosedLoopResult(issued, steps, engine.clock.now() - start)
