"""LLMEngine: the real engine: a torch runner under the engine core (core/engine_core.py),
plus the text around it: tokenizing prompts, detokenizing outputs, stop strings.

    step() = core.step()  (schedule -> runner.execute -> update, stop strings in between)
             -> StepResult(record, emitted, finished)

The scheduler, its KV block manager and its step records are exactly the ones the
simulator uses; only the runner differs (a torch model instead of a cost model).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from stepserve.config.load import ConfigOverrides
from stepserve.config.settings import EngineConfig
from stepserve.core.base import SchedulerBase
from stepserve.core.clock import Clock, WallClock
from stepserve.core.engine_core import EngineCore
from stepserve.core.output import StepResult
from stepserve.core.request import Request, RequestStatus, SamplingParams, child_params
from stepserve.core.request_limits import cache_salt_refusal, check_text, stop_tokens_refusal
from stepserve.engine.outputs import (
    CompletionOutput,
    RequestMetrics,
    RequestOutput,
    logprobs_list,
)
from stepserve.engine.runner_settings import settings_for_runner
from stepserve.host.step_threads import follow_free_cores

log = logging.getLogger("stepserve.engine")


class LLMEngine:
    def __init__(self, model: str | Path = "default",
                 config: EngineConfig | ConfigOverrides | None = None, *,
                 dtype: str = "float32", device: str = "cpu", clock: Clock | None = None,
                 runner=None, strict_max_model_len: bool = False,
                 quantization: str | None = "auto") -> None:
        """`config`: a complete EngineConfig is used as it is; settings (ConfigOverrides,
        or None for none) are applied on the hardware's scheduling defaults
        (host/step_budget.py). `runner`: reuse an already loaded TorchRunner (its weights and
        KV store) instead of loading `model` again; this engine gets a fresh KV block
        manager over it. A max_model_len beyond the model's is lowered to it, or with
        `strict_max_model_len` (the user chose it) refused, as vLLM does.
        `quantization`: the weight mode (model/modes.py)."""
        from stepserve.model.runner import TorchRunner  # torch only when a model runs

        overrides = ConfigOverrides() if config is None else config
        if isinstance(overrides, ConfigOverrides):
            config = overrides.apply()  # the user's settings on the plain defaults
        assert isinstance(config, EngineConfig)
        if config.replicas > 1:  # one engine here; replicas run on Ray Serve (cluster/)
            raise ValueError(
                f"replicas = {config.replicas}: LLM and LLMEngine run one engine in this "
                f"process; serve replicas with `stepserve serve --replicas {config.replicas}` "
                "(Ray Serve: pip install -e '.[cluster]')")
        if runner is None:
            runner = TorchRunner.from_config(model, config.cache, dtype=dtype, device=device,
                                             quantization=quantization)
        self.runner = runner
        self.config, self.step_budget = settings_for_runner(
            config, overrides if isinstance(overrides, ConfigOverrides) else None, runner,
            strict_max_model_len)
        config = self.config
        self.step_threads = follow_free_cores(runner, config.threads)
        self.clock = clock or WallClock()
        self.core = EngineCore(config, runner, self.clock, runner.num_gpu_blocks,
                               on_tokens=self._process_text)
        self.tokenizer = self.runner.tokenizer
        self._prompts: dict[str, str | None] = {}
        self._detok: dict[str, object] = {}  # request id -> IncrementalDetokenizer
        self._children: dict[str, set[str]] = {}  # n > 1: parent id -> live children
        # request id -> where its text ends, for one a stop string ended (the match
        # itself kept with include_stop_str_in_output)
        self._text_end: dict[str, int] = {}
        self._counter = 0

    @property
    def scheduler(self) -> SchedulerBase:
        """The core's scheduler, for tests that look inside; a driver reads
        `core.snapshot()` and ends requests through `core.finish_request`."""
        return self.core.scheduler

    # ---- requests ----
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    stream_text: bool = False, cache_salt: str | None = None) -> Request:
        """Queue a prompt (text or token ids) with n = 1 (`add_parallel` takes any n). A
        request the scheduler rejects comes back already finished, with status
        FINISHED_REJECTED and the reason in finish_message (and is in no StepResult)."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError(f"n = {params.n}: add_request queues one sequence; use "
                             "add_parallel for n > 1")
        (request,) = self.add_parallel(prompt, params, request_id, arrival_time,
                                       stream_text, cache_salt)
        return request

    def add_parallel(self, prompt: str | list[int], params: SamplingParams | None = None,
                     request_id: str | None = None, arrival_time: float | None = None,
                     stream_text: bool = False, cache_salt: str | None = None
                     ) -> list[Request]:
        """Queue a prompt as `params.n` sequences, as vLLM V1 does: n child requests of the
        same prompt with their own KV (ids `"{i}_{request_id}"`, `child_params` seeds);
        n = 1 is the request itself. Returns the children in index order; if admission
        refused one, the ones before it are aborted and only the refused one (finished)
        comes back. `abort_request(request_id)` aborts every child. `cache_salt`: the
        prefix cache's namespace (vLLM's): requests of different salts share no block."""
        params = params or SamplingParams()
        # inputs this model cannot take (request_limits.py says why), as the server's 400
        refusal = (check_text("prompt", prompt) if isinstance(prompt, str) else None) or \
            cache_salt_refusal(cache_salt) or \
            stop_tokens_refusal(params.stop_token_ids, params.min_tokens,
                                self.runner.args.vocab_size, self.runner.eos_token_id)
        if refusal:
            raise ValueError(refusal)
        if request_id is None:
            request_id = f"req-{self._counter}"
            self._counter += 1
        ids, text = self._prompt_ids(prompt)
        arrival = self.clock.now() if arrival_time is None else arrival_time
        if params.n == 1:
            return [self._add(Request(request_id, ids, params, arrival_time=arrival,
                                      eos_token_id=self.runner.eos_token_id,
                                      cache_salt=cache_salt), text,
                              stream_text)]
        children: list[Request] = []
        for k in range(params.n):
            child = self._add(Request(f"{k}_{request_id}", list(ids), child_params(params, k),
                                      arrival_time=arrival,
                                      eos_token_id=self.runner.eos_token_id,
                                      parent_id=request_id, index=k,
                                      cache_salt=cache_salt), text, stream_text)
            if child.is_finished:
                for c in children:
                    self.core.abort_request(c.request_id, "a sibling was refused")
                self.release(children)
                return [child]
            children.append(child)
        self._children[request_id] = {c.request_id for c in children}
        return children

    def _prompt_ids(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt), prompt
        ids = list(prompt)
        vocab = self.runner.args.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); "
                             f"got {bad[:5]}")
        return ids, None

    def _add(self, request: Request, text: str | None, stream_text: bool) -> Request:
        params = request.sampling_params
        self._prompts[request.request_id] = text
        if params.stop or stream_text:
            self._detok[request.request_id] = self.tokenizer.detokenizer(
                request.prompt_token_ids, skip_special_tokens=params.skip_special_tokens)
        if not self.core.add_request(request):
            self.release([request])
        return request

    def abort_request(self, request_id: str, message: str = "aborted by the client") -> bool:
        """End a live request; a parent's id (n > 1) ends every child still running."""
        children = self._children.get(request_id)
        if children is None:
            return self.core.abort_request(request_id, message)
        return any([self.core.abort_request(c, message) for c in sorted(children)])

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    # ---- the loop ----
    def step(self) -> StepResult:
        """One engine step (core/engine_core.py): what ran, who got a token, who ended."""
        return self.core.step()

    def run_until_done(self) -> None:
        from stepserve.engine.drive import run_to_completion

        run_to_completion(self)

    def _process_text(self, emitted: list[Request]) -> None:
        """Each new token into its request's text; a stop string ends the request. A
        failure here ends that request alone."""
        for req in emitted:
            detok = self._detok.get(req.request_id)
            if detok is None:
                continue
            try:
                delta = detok.add(req.output_token_ids[-1])
                self._check_stop_strings(req, detok.text, len(delta))
            except Exception as e:
                log.exception("detokenizing request %s failed", req.request_id)
                self.core.finish_request(req.request_id, RequestStatus.FINISHED_ERROR,
                                         f"detokenizing failed: {type(e).__name__}: {e}")

    def _check_stop_strings(self, req: Request, text: str, num_new: int) -> None:
        """End `req` at the first stop string that its `num_new` newest characters
        complete (one seen before min_tokens did not stop it, and does not now)."""
        params = req.sampling_params
        if req.is_finished or not params.stop or req.num_output_tokens <= params.min_tokens:
            return  # as vLLM: no stop string ends a request before min_tokens
        found = [(k, stop) for stop in params.stop if stop and (k := text.find(
            stop, max(len(text) - num_new - len(stop) + 1, 0))) >= 0]
        if not found:
            return
        k, stop = min(found)
        if self.core.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED,
                                    f"stop string {stop!r}", stop_reason=stop):
            self._text_end[req.request_id] = k + len(stop) * params.include_stop_str_in_output

    # ---- results ----
    def decode_output(self, req: Request) -> str:
        """All of `req`'s output tokens as text (special tokens as its params say)."""
        return self.tokenizer.decode(req.output_token_ids,
                                     req.sampling_params.skip_special_tokens)

    def text_of(self, req: Request) -> str:
        """The completion text so far (a stream's text: the incremental detokenizer's,
        which holds back an unfinished character), ending where a stop string ended it."""
        detok = self._detok.get(req.request_id)
        if detok is None:
            return self.decode_output(req)
        end = self._text_end.get(req.request_id)
        return detok.text if end is None else detok.text[:end]

    def final_text(self, req: Request) -> str:
        """The text an ended request reports, offline and served alike: cut at the stop
        string that stopped it (kept with include_stop_str_in_output); else all its tokens
        decoded, unless that does not extend the streamed text (then the streamed one)."""
        detok = self._detok.get(req.request_id)
        if detok is None or req.request_id in self._text_end:
            return self.text_of(req)
        plain = self.decode_output(req)
        return plain if plain.startswith(detok.text) else detok.text

    def output_of(self, requests: Request | Sequence[Request]) -> RequestOutput:
        """One request's output in vLLM's shape; the children of an n > 1 request (in
        index order) make one output with n completions."""
        group = [requests] if isinstance(requests, Request) else list(requests)
        first = group[0]
        decode = self._token_text
        prompt_lp = logprobs_list(first.prompt_logprobs, decode)
        if prompt_lp is not None:
            prompt_lp = [None, *prompt_lp]
        finished = all(r.is_finished for r in group)
        return RequestOutput(
            request_id=first.parent_id or first.request_id,
            prompt=self._prompts.get(first.request_id), prompt_token_ids=first.prompt_token_ids,
            outputs=[self._completion(r) for r in group], finished=finished,
            metrics=RequestMetrics.of(first),
            message="; ".join(dict.fromkeys(r.finish_message for r in group if r.finish_message)),
            prompt_logprobs=prompt_lp, num_cached_tokens=min(r.num_cached_tokens for r in group))

    def _completion(self, req: Request) -> CompletionOutput:
        reason = req.finish_reason.value if req.finish_reason else None
        found = req.output_logprobs
        return CompletionOutput(
            req.index, self.final_text(req), list(req.output_token_ids), reason, req.stop_reason,
            None if found is None else sum(lp.logprob for lp in found),
            logprobs_list(found, self._token_text))

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def release(self, requests: Iterable[Request]) -> None:
        """Forget per-request text state of ended requests (and of a parent whose
        children have all been released)."""
        for r in requests:
            self._prompts.pop(r.request_id, None)
            self._detok.pop(r.request_id, None)
            self._text_end.pop(r.request_id, None)
            if r.parent_id is not None and (kids := self._children.get(r.parent_id)):
                kids.discard(r.request_id)
                if not kids:
                    del self._children[r.parent_id]
