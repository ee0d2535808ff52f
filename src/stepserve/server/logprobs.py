"""The engine's TokenLogprobs in OpenAI's shapes (and vLLM's prompt_logprobs), rendered
straight to JSON text. A logprob of -inf is sent as -9999.0, as OpenAI and vLLM do; token
texts are each token decoded alone, special tokens included.

Why text: an answer may hold a few hundred thousand entries; as pydantic models they cost
~15 us each, and as dicts every one is an object the cyclic GC walks (a collection held
the event loop for tenths of a second). Strings are never walked.

Why `pace`: a quarter million entries take a render thread about a second of pure
Python, and while it holds the interpreter lock each of the engine thread's re-takes
after a torch call waits out the 5 ms switch interval (a few-ms decode step became half a
second). So a render thread rests REST_S after every WORK_S of work.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Sequence

from stepserve.core.request import TokenLogprobs

LOGPROB_FLOOR = -9999.0
_FLOOR_TEXT = repr(LOGPROB_FLOOR)

# (token id, its logprobs; None for a prompt's first token)
Entry = tuple[int, TokenLogprobs | None]

JSONText = str  # one JSON value, rendered

WORK_S = 0.002  # render work between rests
REST_S = 0.001  # a rest: the lock is free for the engine and the event loop

_pacing = threading.local()


def render_thread() -> None:
    """A thread pool's initializer: this thread's renders pace themselves."""
    _pacing.since = time.perf_counter()


def pace() -> None:
    """Called between pieces of a render (a token, a position): rests when due."""
    since = getattr(_pacing, "since", None)
    if since is not None and time.perf_counter() - since >= WORK_S:
        time.sleep(REST_S)
        _pacing.since = time.perf_counter()


def number(value: float) -> JSONText:
    """A logprob as JSON; -inf (anything not finite) as the floor."""
    return repr(value) if LOGPROB_FLOOR < value < math.inf else _FLOOR_TEXT


class LogprobRenderer:
    """One request's renderer: `top` alternatives per token (the request's top_logprobs
    or logprobs), each token's text and its JSON pieces made once. Used by one thread at
    a time (an answer's renders follow each other)."""

    def __init__(self, tokenizer, top: int) -> None:
        self.top = top
        # a token's text, and that text as a JSON string (closures over no `self`: no cycle)
        self.text = text = functools.cache(
            lambda tid: tokenizer.decode([tid], skip_special_tokens=False))
        self.quoted = functools.cache(lambda tid: json.dumps(text(tid), ensure_ascii=False))
        self._chat: dict[int, tuple[JSONText, JSONText]] = {}

    def _chat_entry(self, token_id: int, value: float) -> JSONText:
        """`{"token": .., "logprob": .., "bytes": [..]` (left open for top_logprobs)."""
        pieces = self._chat.get(token_id)
        if pieces is None:
            utf8 = json.dumps(list(self.text(token_id).encode()), separators=(",", ":"))
            pieces = self._chat[token_id] = (f'{{"token":{self.quoted(token_id)},"logprob":',
                                             f',"bytes":{utf8}')
        return pieces[0] + number(value) + pieces[1]

    def chat(self, found: Sequence[TokenLogprobs]) -> JSONText:
        """ChoiceLogprobs: per token {token, logprob, bytes, top_logprobs}; as vLLM lists
        them, the chosen token first, then the likeliest others, `top` in all."""
        entry = self._chat_entry
        tokens: list[JSONText] = []
        for lp in found:
            pace()
            others = [(tid, v) for tid, v in lp.top if tid != lp.token_id]
            shown = [(lp.token_id, lp.logprob), *others[:self.top - 1]] if self.top else []
            tokens.append(entry(lp.token_id, lp.logprob) + ',"top_logprobs":['
                          + ",".join(entry(tid, v) + "}" for tid, v in shown) + "]}")
        return '{"content":[' + ",".join(tokens) + "]}"

    def completion(self, entries: Sequence[Entry], offset: int) -> tuple[JSONText, int]:
        """CompletionLogprobs for these tokens, whose text starts at `offset` in the
        choice's text; and the offset after them."""
        tokens: list[JSONText] = []
        offsets: list[str] = []
        values: list[JSONText] = []
        tops: list[JSONText] = []
        for tid, lp in entries:
            pace()
            tokens.append(self.quoted(tid))
            offsets.append(str(offset))
            offset += len(self.text(tid))
            if lp is None:
                values.append("null")
                tops.append("null")
                continue
            values.append(number(lp.logprob))
            # the chosen token first, then the top ones, as vLLM lists them; tokens that
            # decode alike (byte pieces of one character) share a key: the likelier
            # one's logprob is shown
            alternatives: dict[JSONText, float] = {self.quoted(tid): lp.logprob}
            for i, v in lp.top[:self.top]:
                key = self.quoted(i)
                if v > alternatives.get(key, -math.inf):
                    alternatives[key] = v
            tops.append("{" + ",".join(f"{k}:{number(v)}" for k, v in alternatives.items())
                        + "}")
        return (f'{{"text_offset":[{",".join(offsets)}],"token_logprobs":[{",".join(values)}],'
                f'"tokens":[{",".join(tokens)}],"top_logprobs":[{",".join(tops)}]}}', offset)

    def vllm_prompt(self, found: Sequence[TokenLogprobs]) -> JSONText:
        """vLLM's prompt_logprobs: null for the first prompt token (nothing predicts
        it), then per token {token id: {logprob, rank, decoded_token}} of the prompt
        token and the top alternatives."""
        positions = ["null"]
        for lp in found:
            pace()
            entries = [self._vllm(lp.token_id, lp.logprob, lp.rank)]
            entries += [self._vllm(tid, v, rank) for rank, (tid, v) in
                        enumerate(lp.top, start=1) if tid != lp.token_id]
            positions.append("{" + ",".join(entries) + "}")
        return "[" + ",".join(positions) + "]"

    def _vllm(self, token_id: int, value: float, rank: int) -> JSONText:
        return (f'"{token_id}":{{"logprob":{number(value)},"rank":{rank},'
                f'"decoded_token":{self.quoted(token_id)}}}')


def prompt_entries(prompt_ids: Sequence[int], found: Sequence[TokenLogprobs] | None
                   ) -> list[Entry]:
    """The prompt's tokens with their logprobs (the first has none)."""
    lps: list[TokenLogprobs | None] = [None, *(found or [])]
    return [(tid, lps[k] if k < len(lps) else None) for k, tid in enumerate(prompt_ids)]


def output_entries(found: Sequence[TokenLogprobs] | None) -> list[Entry]:
    return [(lp.token_id, lp) for lp in found or ()]
