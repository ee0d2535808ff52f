"""The engine's TokenLogprobs in OpenAI's shapes (and vLLM's prompt_logprobs).

Chat: per token {token, logprob, bytes, top_logprobs: the k most likely}. Completions
(legacy): parallel lists of tokens, their logprobs, their offsets in the choice's text,
and per token {text: logprob} of the top k plus the token itself; with echo the prompt's
tokens come first, the very first one with nulls (nothing predicts it). A logprob of
-inf is sent as -9999.0, as OpenAI and vLLM do (JSON has no infinity). Token texts are
each token decoded alone, special tokens included.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepserve.request import TokenLogprobs
from stepserve.server.responses import (
    ChoiceLogprobs,
    CompletionLogprobs,
    PromptLogprobs,
    TokenLogprob,
    TopLogprob,
    VllmLogprob,
)

LOGPROB_FLOOR = -9999.0

# (token id, its logprobs; None for a prompt's first token)
Entry = tuple[int, TokenLogprobs | None]


def _clamp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class LogprobRenderer:
    """One request's renderer: `top` alternatives per token (the request's top_logprobs
    or logprobs), token texts decoded once each."""

    def __init__(self, tokenizer, top: int) -> None:
        self.tokenizer = tokenizer
        self.top = top
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        t = self._texts.get(token_id)
        if t is None:
            t = self._texts[token_id] = self.tokenizer.decode([token_id],
                                                              skip_special_tokens=False)
        return t

    def chat(self, found: Sequence[TokenLogprobs]) -> ChoiceLogprobs:
        def top(tid: int, value: float) -> TopLogprob:
            t = self.text(tid)
            return TopLogprob(token=t, logprob=_clamp(value), bytes=list(t.encode()))

        return ChoiceLogprobs(content=[
            TokenLogprob(token=self.text(lp.token_id), logprob=_clamp(lp.logprob),
                         bytes=list(self.text(lp.token_id).encode()),
                         top_logprobs=[top(tid, v) for tid, v in lp.top[:self.top]])
            for lp in found])

    def completion(self, entries: Sequence[Entry], offset: int
                   ) -> tuple[CompletionLogprobs, int]:
        """The legacy block for these tokens, whose text starts at `offset` in the
        choice's text; and the offset after them."""
        out = CompletionLogprobs()
        for tid, lp in entries:
            t = self.text(tid)
            out.tokens.append(t)
            out.text_offset.append(offset)
            offset += len(t)
            if lp is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_clamp(lp.logprob))
            # tokens that decode alike (byte pieces of one character) share a key:
            # the likelier one keeps it
            tops: dict[str, float] = {}
            for i, v in lp.top[:self.top]:
                tops.setdefault(self.text(i), _clamp(v))
            tops.setdefault(t, _clamp(lp.logprob))
            out.top_logprobs.append(tops)
        return out, offset

    def vllm_prompt(self, prompt_ids: Sequence[int],
                    found: Sequence[TokenLogprobs]) -> PromptLogprobs:
        """vLLM's prompt_logprobs: None for the first token, then {token id: logprob}
        of the prompt token and the top alternatives."""
        out: PromptLogprobs = [None]
        for lp in found:
            entry = {str(lp.token_id): VllmLogprob(logprob=_clamp(lp.logprob), rank=lp.rank,
                                                   decoded_token=self.text(lp.token_id))}
            for rank, (tid, v) in enumerate(lp.top, start=1):
                entry.setdefault(str(tid), VllmLogprob(logprob=_clamp(v), rank=rank,
                                                       decoded_token=self.text(tid)))
            out.append(entry)
        return out[:len(prompt_ids)]


def prompt_entries(prompt_ids: Sequence[int], found: Sequence[TokenLogprobs] | None
                   ) -> list[Entry]:
    """The prompt's tokens with their logprobs (the first has none)."""
    lps: list[TokenLogprobs | None] = [None, *(found or [])]
    return [(tid, lps[k] if k < len(lps) else None) for k, tid in enumerate(prompt_ids)]


def output_entries(found: Sequence[TokenLogprobs] | None) -> list[Entry]:
    return [(lp.token_id, lp) for lp in found or ()]
