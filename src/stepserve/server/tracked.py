"""What the engine thread keeps of one admitted sequence for its handler (a request, or
one child of an n > 1 request): how much text and how many logprobs were sent, what is
held back, and how its outputs (a delta, the final answer) are made."""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.core.end_reasons import FinishReason
from stepserve.core.request import Request, TokenLogprobs
from stepserve.server.streams import RequestStream, StreamOutput


@dataclass(slots=True)
class Tracked:
    request: Request
    stream: RequestStream
    streamed: bool
    holdback: int  # characters held back: they might be the start of a stop string
    sent: int = 0  # characters of text already sent
    logprobs_sent: int = 0  # output logprobs already sent
    prompt_sent: bool = False  # prompt logprobs already sent

    @classmethod
    def of(cls, request: Request, stream: RequestStream, streamed: bool) -> Tracked:
        params = request.sampling_params
        longest = max((len(s) for s in params.stop), default=1)
        # with include_stop_str_in_output the stop string itself is sent: nothing to hold
        holdback = 0 if params.include_stop_str_in_output else longest - 1
        return cls(request, stream, streamed, holdback)

    def delta(self, text_of) -> StreamOutput:
        """The text that became safe to send since the last delta, and the logprobs of
        the tokens since then."""
        req = self.request
        text = ""
        full = text_of(req)
        end = len(full) - self.holdback
        if end > self.sent:
            text = full[self.sent:end]
            self.sent = end
        return self._with_logprobs(StreamOutput(text, req.num_prompt_tokens,
                                                req.num_output_tokens, index=req.index,
                                                num_cached_tokens=req.num_cached_tokens))

    def final(self, full: str) -> StreamOutput:
        """The request's one final output, `full` being its whole completion."""
        req = self.request
        reason = (req.finish_reason or FinishReason.ERROR).value
        return self._with_logprobs(StreamOutput(
            full[self.sent:] if self.streamed else "", req.num_prompt_tokens,
            req.num_output_tokens, True, reason, req.finish_message, full, req.index,
            num_cached_tokens=req.num_cached_tokens, stop_reason=req.stop_reason))

    def error(self, message: str) -> StreamOutput:
        """A final output for a request that could not be finished normally."""
        req = self.request
        return StreamOutput("", req.num_prompt_tokens, req.num_output_tokens, True,
                            FinishReason.ERROR.value, message, "", req.index,
                            num_cached_tokens=req.num_cached_tokens)

    def _with_logprobs(self, out: StreamOutput) -> StreamOutput:
        req = self.request
        if req.output_logprobs is not None:
            out.logprobs = _new(req.output_logprobs, self.logprobs_sent)
            self.logprobs_sent = len(req.output_logprobs)
        if req.prompt_logprobs is not None and not self.prompt_sent:
            out.prompt_logprobs = list(req.prompt_logprobs)
            self.prompt_sent = True
        return out


def _new(items: list[TokenLogprobs], start: int) -> list[TokenLogprobs]:
    return items[start:]
