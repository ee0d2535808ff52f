"""What the engine hands back, and the output processor that makes it: seam.py's
StreamOutputs step by step, and offline vLLM's RequestOutput (logprobs per position as a
dict {token id: Logprob} of the token and the top ones; prompt logprobs start with None).

The processor keeps each live sequence's output state (vLLM v1's RequestStates): its
detokenizer, where a stop string cut it, the characters held back as a possible stop
string's start, what was sent; a state goes with its final output, a parent's with its
last child's. It returns the ends it decides (stop strings, failed text) for the engine
to apply: it knows no core.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stepserve.core.end_reasons import FinishReason
from stepserve.core.request import Request, RequestStatus, TokenLogprobs
from stepserve.engine.seam import StreamOutput

log = logging.getLogger("stepserve.engine")


@dataclass(frozen=True, slots=True)
class End:
    """An end the text decided, for the engine core's `finish_request`."""

    request_id: str
    status: RequestStatus
    message: str
    stop_reason: str | None = None


# (the sequence, its output): the request says which client request and choice it is
Outputs = list[tuple[Request, StreamOutput]]


@dataclass(slots=True)
class SequenceState:
    request: Request
    streamed: bool
    detok: object | None  # IncrementalDetokenizer: for stop strings or a streamed text
    holdback: int  # characters held back: they might be the start of a stop string
    text_end: int | None = None  # where a stop string ended the text (the match kept
    # with include_stop_str_in_output)
    sent: int = 0  # characters of text already sent
    logprobs_sent: int = 0  # output logprobs already sent
    prompt_sent: bool = False  # prompt logprobs already sent

    def delta(self, tokenizer) -> StreamOutput:
        """The text that became safe to send since the last delta, and the logprobs of
        the tokens since then."""
        full = self.text(tokenizer)
        end = max(len(full) - self.holdback, self.sent)
        text, self.sent = full[self.sent:end], end
        return self._output(text)

    def final(self, tokenizer) -> StreamOutput:
        """The sequence's one final output, with its whole completion."""
        req = self.request
        full = self.final_text(tokenizer)
        return self._output(full[self.sent:] if self.streamed else "", finished=True,
                            finish_reason=(req.finish_reason or FinishReason.ERROR).value,
                            message=req.finish_message, full_text=full,
                            stop_reason=req.stop_reason)

    def error(self, message: str) -> StreamOutput:
        """A final output for a sequence that could not be finished normally."""
        return self._output("", with_logprobs=False, finished=True,
                            finish_reason=FinishReason.ERROR.value, message=message,
                            full_text="")

    def _output(self, text: str, with_logprobs: bool = True, **end) -> StreamOutput:
        """An output of this sequence, with the logprobs not sent yet."""
        req = self.request
        out = StreamOutput(text, req.num_prompt_tokens, req.num_output_tokens, index=req.index,
                           num_cached_tokens=req.num_cached_tokens, **end)
        if with_logprobs and req.output_logprobs is not None:
            out.logprobs = req.output_logprobs[self.logprobs_sent:]
            self.logprobs_sent = len(req.output_logprobs)
        if with_logprobs and req.prompt_logprobs is not None and not self.prompt_sent:
            out.prompt_logprobs = list(req.prompt_logprobs)
            self.prompt_sent = True
        return out

    def text(self, tokenizer) -> str:
        """The completion text so far (a stream's text: the incremental detokenizer's,
        which holds back an unfinished character), ending where a stop string ended it."""
        if self.detok is None:
            return decode_output(tokenizer, self.request)
        text = self.detok.text
        return text if self.text_end is None else text[:self.text_end]

    def final_text(self, tokenizer) -> str:
        """The text an ended sequence reports, offline and served alike: cut at the stop
        string that stopped it; else all its tokens decoded, unless that does not extend
        the streamed text (then the streamed one)."""
        if self.detok is None or self.text_end is not None:
            return self.text(tokenizer)
        plain = decode_output(tokenizer, self.request)
        return plain if plain.startswith(self.detok.text) else self.detok.text


def decode_output(tokenizer, req: Request) -> str:
    """All of `req`'s output tokens as text (special tokens as its params say)."""
    return tokenizer.decode(req.output_token_ids, req.sampling_params.skip_special_tokens)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._live: dict[str, SequenceState] = {}  # by the sequence's request id
        self._children: dict[str, set[str]] = {}  # n > 1: parent id -> live children

    def add(self, request: Request, streamed: bool) -> None:
        """Follow a sequence the core took; `streamed`: it sends text as it comes."""
        params = request.sampling_params
        detok = None
        if params.stop or streamed:
            detok = self.tokenizer.detokenizer(
                request.prompt_token_ids, skip_special_tokens=params.skip_special_tokens)
        longest = max((len(s) for s in params.stop), default=1)
        # with include_stop_str_in_output the stop string itself is sent: nothing to hold
        holdback = 0 if params.include_stop_str_in_output else longest - 1
        self._live[request.request_id] = SequenceState(request, streamed, detok, holdback)
        if request.parent_id is not None:
            self._children.setdefault(request.parent_id, set()).add(request.request_id)

    def sequence_ids(self, request_id: str) -> list[str]:
        """The live sequences a client's request id names: an n > 1 request's children,
        else the id itself."""
        children = self._children.get(request_id)
        return [request_id] if children is None else sorted(children)

    @property
    def is_empty(self) -> bool:
        """Nothing followed: no sequence, no parent."""
        return not self._live and not self._children

    def add_tokens(self, emitted: Iterable[Request]) -> list[End]:
        """Each new token into its sequence's text; a stop string ends the sequence, a
        failure here ends that sequence alone."""
        ends = []
        for req in emitted:
            state = self._live.get(req.request_id)
            if state is None or state.detok is None:
                continue
            try:
                delta = state.detok.add(req.output_token_ids[-1])
                end = self._stop_string(state, len(delta))
            except Exception as e:
                log.exception("detokenizing request %s failed", req.request_id)
                end = End(req.request_id, RequestStatus.FINISHED_ERROR,
                          f"detokenizing failed: {type(e).__name__}: {e}")
            if end is not None:
                ends.append(end)
        return ends

    def _stop_string(self, state: SequenceState, num_new: int) -> End | None:
        """The end at the first stop string that the `num_new` newest characters
        complete (one seen before min_tokens did not stop it, and does not now)."""
        req = state.request
        params = req.sampling_params
        if req.is_finished or not params.stop or req.num_output_tokens <= params.min_tokens:
            return None  # as vLLM: no stop string ends a request before min_tokens
        text = state.detok.text
        found = [(k, stop) for stop in params.stop if stop and (k := text.find(
            stop, max(len(text) - num_new - len(stop) + 1, 0))) >= 0]
        if not found:
            return None
        k, stop = min(found)
        state.text_end = k + len(stop) * params.include_stop_str_in_output
        return End(req.request_id, RequestStatus.FINISHED_STOPPED, f"stop string {stop!r}",
                   stop)

    def process(self, emitted: Iterable[Request], finished: Iterable[Request]
                ) -> tuple[Outputs, list[End]]:
        """A step's outputs: a delta for each streamed sequence that got a token and goes
        on, then the final output of each that ended (its state dropped). A delta that
        fails is that sequence's final output, an error, and an end for the core."""
        outputs: Outputs = []
        ends = []
        for req in emitted:
            state = self._live.get(req.request_id)
            if state is None or not state.streamed or req.is_finished:
                continue  # an ended one gets its final output below
            try:
                outputs.append((req, state.delta(self.tokenizer)))
            except Exception as e:  # this sequence's text is broken, not the others'
                log.exception("streaming request %s failed", req.request_id)
                message = f"streaming failed: {type(e).__name__}: {e}"
                ends.append(End(req.request_id, RequestStatus.FINISHED_ERROR, message))
                outputs.append((req, self._drop(state).error(message)))
        for req in finished:
            state = self._live.get(req.request_id)
            if state is None:
                continue  # answered already, or never followed (refused at admission)
            self._drop(state)
            try:
                out = state.final(self.tokenizer)
            except Exception as e:
                log.exception("the final text of request %s failed", req.request_id)
                out = state.error(f"the final text failed: {type(e).__name__}: {e}")
            outputs.append((req, out))
        return outputs, ends

    def fail_all(self, message: str) -> Outputs:
        """The engine cannot go on: every live sequence's final output, an error."""
        outputs = [(s.request, s.error(message)) for s in list(self._live.values())]
        self._live.clear()
        self._children.clear()
        return outputs

    def _drop(self, state: SequenceState) -> SequenceState:
        req = state.request
        del self._live[req.request_id]
        if req.parent_id is not None and (kids := self._children.get(req.parent_id)):
            kids.discard(req.request_id)
            if not kids:
                del self._children[req.parent_id]
        return state


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # stop, length, abort, rejected, timed_out
    stop_reason: str | int | None = None  # the stop string or token that ended it
    cumulative_logprob: float | None = None  # with logprobs: the sum of the tokens'
    logprobs: list[PositionLogprobs] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
    message: str = ""  # why it ended, when it did not end normally
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    # prompt tokens served from the prefix cache at admission (vLLM's field; whole
    # blocks); n > 1: the fewest any sequence got, as the server's usage counts them
    num_cached_tokens: int = 0

    @classmethod
    def of(cls, group: Sequence[Request], finals: Sequence[StreamOutput], prompt: str | None,
           decode: Callable[[int], str]) -> RequestOutput:
        """One request's output from its sequences (the children of an n > 1 request, in
        index order) and their final outputs (the same order)."""
        first = group[0]
        prompt_lp = logprobs_list(first.prompt_logprobs, decode)
        if prompt_lp is not None:
            prompt_lp = [None, *prompt_lp]
        completions = []
        for req, final in zip(group, finals, strict=True):
            found = req.output_logprobs
            completions.append(CompletionOutput(
                req.index, final.full_text or "", list(req.output_token_ids),
                final.finish_reason, req.stop_reason,
                None if found is None else sum(lp.logprob for lp in found),
                logprobs_list(found, decode)))
        messages = (f.message for f in finals if f.message)
        metrics = RequestMetrics(first.arrival_time, first.first_scheduled_time,
                                 first.token_times[0] if first.token_times else None,
                                 first.finish_time, first.num_preemptions)
        return cls(first.parent_id or first.request_id, prompt, first.prompt_token_ids,
                   completions, all(r.is_finished for r in group), metrics,
                   "; ".join(dict.fromkeys(messages)), prompt_lp,
                   min(r.num_cached_tokens for r in group))


def logprobs_list(found: Sequence[TokenLogprobs] | None,
                  decode: Callable[[int], str]) -> list[PositionLogprobs] | None:
    """Each position as vLLM's dict: the token itself first, then the top ones."""
    if found is None:
        return None
    out = []
    for lp in found:
        position = {lp.token_id: Logprob(lp.logprob, lp.rank, decode(lp.token_id))}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            position.setdefault(tid, Logprob(value, rank, decode(tid)))
        out.append(position)
    return out
