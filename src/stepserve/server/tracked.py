"""What the engine thread keeps of one admitted request for its handler: how much text
was sent, what is held back, and how its outputs (a delta, the final answer) are made."""

from __future__ import annotations

from dataclasses import dataclass

from stepserve.request import Request
from stepserve.server.streams import RequestStream, StreamOutput


@dataclass(slots=True)
class Tracked:
    request: Request
    stream: RequestStream
    streamed: bool
    holdback: int  # characters held back: they might be the start of a stop string
    sent: int = 0  # characters of text already sent

    @classmethod
    def of(cls, request: Request, stream: RequestStream, streamed: bool) -> Tracked:
        stops = request.sampling_params.stop
        return cls(request, stream, streamed, max((len(s) for s in stops), default=1) - 1)

    def delta(self, text_of) -> StreamOutput:
        """The text that became safe to send since the last delta."""
        req = self.request
        text = ""
        full = text_of(req)
        end = len(full) - self.holdback
        if end > self.sent:
            text = full[self.sent:end]
            self.sent = end
        return StreamOutput(text, req.num_prompt_tokens, req.num_output_tokens)

    def final(self, full: str) -> StreamOutput:
        """The request's one final output, `full` being its whole completion."""
        req = self.request
        reason = req.finish_reason.value if req.finish_reason else "error"
        return StreamOutput(full[self.sent:] if self.streamed else "", req.num_prompt_tokens,
                            req.num_output_tokens, True, reason, req.finish_message, full)

    def error(self, message: str) -> StreamOutput:
        """A final output for a request that could not be finished normally."""
        req = self.request
        return StreamOutput("", req.num_prompt_tokens, req.num_output_tokens, True, "error",
                            message, "")
