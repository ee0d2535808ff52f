"""LLMEngine: the synchronous step loop of the real engine.

    step() = schedule() -> runner.execute() -> update_from_output() -> stop strings

The scheduler, its KV block manager and its step records are exactly the ones the
simulator uses; only the runner differs (a torch model instead of a cost model).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from stepserve.clock import Clock, WallClock
from stepserve.config import EngineConfig
from stepserve.core import SCHEDULERS
from stepserve.core.base import SchedulerBase
from stepserve.core.output import SchedulerOutput
from stepserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from stepserve.request import Request, RequestStatus, SamplingParams

log = logging.getLogger("stepserve.engine")

# A runner that fails this many steps in a row is broken, not unlucky: stop the engine so
# a supervisor can restart the process, instead of failing every request forever.
MAX_CONSECUTIVE_STEP_FAILURES = 3


class EngineDead(RuntimeError):
    """The engine cannot go on (its runner failed step after step)."""


class LLMEngine:
    def __init__(self, model: str | Path = "default", config: EngineConfig | None = None, *,
                 dtype: str = "float32", device: str = "cpu", clock: Clock | None = None,
                 runner=None) -> None:
        """`runner`: reuse an already loaded TorchRunner (its weights and KV cache) instead
        of loading `model` again; its KV blocks must all be free."""
        from stepserve.model.runner import TorchRunner  # torch only when a model runs

        config = config or EngineConfig()
        if runner is None:
            runner = TorchRunner.from_config(model, config.cache, dtype=dtype, device=device)
        elif not runner.kv_cache_manager.all_free:
            raise ValueError("a shared runner must have every KV block free")
        self.runner = runner
        limit = self.runner.args.max_position_embeddings
        if limit and config.scheduler.max_model_len > limit:
            config = config.replace(max_model_len=limit)  # the model cannot go further
        self.config = config
        self.clock = clock or WallClock()
        self.scheduler: SchedulerBase = SCHEDULERS[config.scheduler.batching](
            config, self.runner.kv_cache_manager, self.clock)
        self.tokenizer = self.runner.tokenizer
        self._prompts: dict[str, str | None] = {}
        self._detok: dict[str, object] = {}  # request id -> IncrementalDetokenizer
        self._counter = 0
        self._failed_in_a_row = 0

    # ---- requests ----
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    stream_text: bool = False) -> Request:
        """Queue a prompt (text or token ids). A request the scheduler rejects comes back
        already finished, with status FINISHED_REJECTED and the reason in finish_message."""
        params = params or SamplingParams()
        if request_id is None:
            request_id = f"req-{self._counter}"
            self._counter += 1
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            ids, text = list(prompt), None
            vocab = self.runner.args.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}); "
                                 f"got {bad[:5]}")
        request = Request(request_id, ids, params,
                          arrival_time=self.clock.now() if arrival_time is None else arrival_time,
                          eos_token_id=self.runner.eos_token_id)
        self._prompts[request_id] = text
        if params.stop or stream_text:
            self._detok[request_id] = self.tokenizer.detokenizer(ids)
        self.scheduler.add_request(request)
        return request

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop ----
    def step(self) -> list[Request]:
        """One engine step. Returns the requests that got a token (some now finished).

        Failure isolation: an exception while the runner executes the step ends exactly
        the requests that step touched (FINISHED_ERROR, blocks freed) and the engine goes
        on; so does one while detokenizing a request, for that request. Only after
        MAX_CONSECUTIVE_STEP_FAILURES failed steps in a row (the runner itself is broken)
        does step() raise EngineDead. A fault in the scheduler raises: its state is no
        longer trustworthy."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        try:
            result = self.runner.execute(out)
        except Exception as e:
            self._step_failed(out, e)
            return []
        self._failed_in_a_row = 0
        emitted = self.scheduler.update_from_output(out, result)
        for req in emitted:
            detok = self._detok.get(req.request_id)
            if detok is None:
                continue
            try:
                detok.add(req.output_token_ids[-1])
                self._check_stop_strings(req, detok)
            except Exception as e:
                log.exception("detokenizing request %s failed", req.request_id)
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_ERROR,
                                              f"detokenizing failed: {type(e).__name__}: {e}")
        return emitted

    def _step_failed(self, out: SchedulerOutput, error: Exception) -> None:
        self._failed_in_a_row += 1
        message = f"the engine step failed: {type(error).__name__}: {error}"
        log.error("step %d failed; ending its %d requests", out.step_index,
                  len(out.requests), exc_info=error)
        self.scheduler.fail_step(out, message)
        if self._failed_in_a_row >= MAX_CONSECUTIVE_STEP_FAILURES:
            raise EngineDead(f"{self._failed_in_a_row} engine steps failed in a row; the "
                             f"last: {message}") from error

    def _check_stop_strings(self, req: Request, detok) -> None:
        if req.is_finished or not req.sampling_params.stop:
            return
        text = detok.text
        for stop in req.sampling_params.stop:
            if stop and stop in text[-(len(stop) + 64):]:
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED,
                                              f"stop string {stop!r}")
                return

    def run_until_done(self) -> None:
        while self.has_unfinished():
            self.step()

    # ---- results ----
    def text_of(self, req: Request) -> str:
        """The completion text, cut before a stop string that ended it."""
        detok = self._detok.get(req.request_id)
        text = detok.text if detok is not None else \
            self.tokenizer.decode(req.output_token_ids)
        for stop in req.sampling_params.stop:
            k = text.find(stop) if stop else -1
            if k >= 0:
                text = text[:k]
        return text

    def output_of(self, req: Request) -> RequestOutput:
        stop_reason = None
        if req.finish_message.startswith("stop string"):
            stop_reason = next((s for s in req.sampling_params.stop
                                if repr(s) in req.finish_message), None)
        elif req.status is RequestStatus.FINISHED_STOPPED and req.output_token_ids:
            stop_reason = req.output_token_ids[-1]
        reason = req.finish_reason.value if req.finish_reason else None
        return RequestOutput(
            request_id=req.request_id, prompt=self._prompts.get(req.request_id),
            prompt_token_ids=req.prompt_token_ids,
            outputs=[CompletionOutput(0, self.text_of(req), list(req.output_token_ids),
                                      reason, stop_reason)],
            finished=req.is_finished, metrics=RequestMetrics.of(req), message=req.finish_message)

    def release(self, requests: Iterable[Request]) -> None:
        """Forget per-request text state of ended requests."""
        for r in requests:
            self._prompts.pop(r.request_id, None)
            self._detok.pop(r.request_id, None)
