"""The prompt each bench request sends, of its spec's length: text by default, as `vllm
bench serve` sends it (with a tokenizer, text that encodes to exactly `prompt_len` tokens;
without one, common English words, about one token each), or token ids when asked.

Every prompt is drawn from its request's own seed, so two requests share no prefix (a
server's prefix cache would otherwise serve most of every prompt) and a run is
reproducible. Prompts share exactly their shared prefix, as the simulator's do; a
Mooncake trace's prompts share text exactly as far as their hash ids agree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepserve.config.limits import MAX_NUM_REQUESTS
from stepserve.metrics.request_metrics import cacheable_tokens
from stepserve.workload.sessions import next_turns
from stepserve.workload.spec import RequestSpec
from stepserve.workload.trace import TraceSpec, prompt_blocks, trace_token_ids

if TYPE_CHECKING:
    from stepserve.model.tokenizer import Tokenizer

WORDS = tuple(
    "the of and to in is was he for it with as his on be at by had are but from or "
    "she an they which you one were all we her there been if more when will would who so "
    "no time up out them some could him into its then two now may only see made over new "
    "after also did many down way most well back year work life day good long world part "
    "small great place old same head night house light point water hand open".split())
FIT_TRIES = 8  # decode/encode rounds before a text's length is taken as it stands
# Fitted trace block texts kept for reuse: a trace repeats its hash ids (that is its
# point), and fitting one is a few encode/decode rounds. Bounded: a long trace has millions.
MAX_CACHED_BLOCKS = 100_000


FIRST_ID = 10  # token ids below this are left alone: special tokens sit there
# the digits written cover every index a run can have (warm-ups ride on top of the count)
_INDEX_DIGITS_MAX = 4 * MAX_NUM_REQUESTS


def _own_len(spec: RequestSpec) -> int:
    return spec.prompt_len - spec.prefix_len - spec.history_len


def token_prompt(spec: RequestSpec, vocab: int = 500, seed: int = 0) -> list[int]:
    """Exactly spec.prompt_len token ids in [FIRST_ID, vocab): its prefix's ids, then its
    own, which open with its index in base (vocab - FIRST_ID) digits and go on at random
    (the old prompts, one formula of the index, came round again every 490 requests).
    A trace's request: the ids its block hashes give (workload/trace.py)."""
    if isinstance(spec, TraceSpec):
        return trace_token_ids(spec, vocab)
    span = max(vocab - FIRST_ID, 2)
    own = [FIRST_ID + d for d in _digits(spec.index, span)]
    rng = _rng(spec, seed)
    own += [FIRST_ID + rng.randrange(span) for _ in range(_own_len(spec) - len(own))]
    if spec.prefix is None:
        return own[:spec.prompt_len]
    rng = random.Random(_prefix_seed(spec.prefix, seed))
    return [FIRST_ID + rng.randrange(span) for _ in range(spec.prefix_len)] + own[:_own_len(spec)]


def _digits(n: int, base: int) -> list[int]:
    """`n` in `base`, least significant first (a short prompt keeps the digits that tell
    neighbours apart), at one width for every index, so no index's digits begin
    another's."""
    width, top = 1, base
    while top < _INDEX_DIGITS_MAX:
        width, top = width + 1, top * base
    return [(n // base ** k) % base for k in range(width)]


def _rng(spec: RequestSpec, seed: int) -> random.Random:
    return random.Random(seed * 1_000_003 + spec.index)


def _prefix_seed(name: str, seed: int) -> str:
    return f"{seed}/prefix/{name}"


def word_prompt(spec: RequestSpec, seed: int = 0) -> str:
    """spec.prompt_len words drawn from WORDS: its prefix's from the prefix's seed, then
    its own from the request's."""
    own = _words(_rng(spec, seed), _own_len(spec))
    if spec.prefix is None:
        return own
    return _words(random.Random(_prefix_seed(spec.prefix, seed)), spec.prefix_len) + " " + own


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def exact_text(tokenizer: Tokenizer, n: int, rng: random.Random) -> str:
    """Text that `tokenizer` encodes (without special tokens) to n tokens: random words
    until there are enough tokens, then the first n tokens decoded, re-encoded and cut
    again until the count holds (a cut can re-encode to another count at its edge)."""
    words: list[str] = []
    ids: list[int] = []
    while len(ids) < n:  # about a token a word: grow by what is missing
        words += [rng.choice(WORDS) for _ in range(n - len(ids))]
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False)
    text = ""
    for _ in range(FIT_TRIES):
        text = tokenizer.decode(ids[:n])
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == n:
            return text
        if len(ids) < n:  # the cut merged tokens: add a word and cut again
            ids = tokenizer.encode(text + " " + rng.choice(WORDS), add_special_tokens=False)
    return text


class PromptMaker:
    """The prompt of each spec: token ids, exact-length text (with a tokenizer) or
    words. Fitted texts of shared prefixes and trace blocks are kept for reuse."""

    def __init__(self, token_ids: bool = False, tokenizer: Tokenizer | None = None,
                 seed: int = 0) -> None:
        self.token_ids = token_ids
        self.tokenizer = tokenizer
        self.seed = seed
        self._texts: dict[tuple[str, int], str] = {}  # (seed, tokens) -> fitted text

    def _fitted(self, seed: str, n: int) -> str:
        assert self.tokenizer is not None
        key = (seed, n)
        if (text := self._texts.get(key)) is None:
            text = exact_text(self.tokenizer, n, random.Random(seed))
            if len(self._texts) >= MAX_CACHED_BLOCKS:
                self._texts.pop(next(iter(self._texts)))  # the oldest
            self._texts[key] = text
        return text

    def fit_to_model(self, model: str) -> None:
        """Text prompts without a tokenizer take the model's, if it loads here."""
        if self.token_ids or self.tokenizer is not None:
            return
        try:
            self.tokenizer = load_tokenizer(model)
        except Exception:  # not installed, not here, unreadable: words, about a token each
            self.tokenizer = None

    def __call__(self, spec: RequestSpec) -> str | list[int]:
        if self.token_ids:
            return token_prompt(spec, seed=self.seed)
        if isinstance(spec, TraceSpec):
            if self.tokenizer is None:
                return " ".join(_words(random.Random(seed), n) for seed, n in prompt_blocks(spec))
            return " ".join(self._fitted(seed, n) for seed, n in prompt_blocks(spec))
        if self.tokenizer is None:
            return word_prompt(spec, self.seed)
        own = exact_text(self.tokenizer, _own_len(spec), _rng(spec, self.seed))
        if spec.prefix is None:
            return own
        # each part fitted on its own: the join can shift a token at the seam, as in
        # vLLM's prefix_repetition (prefix and suffix tokens, decoded together)
        return self._fitted(_prefix_seed(spec.prefix, self.seed), spec.prefix_len) + " " + own

    def describe(self) -> str:
        if self.token_ids:
            return "token-id prompts"
        return "text prompts" + (" of exact token length" if self.tokenizer else
                                 " (words, about a token each: no tokenizer loaded)")


def load_tokenizer(name: str) -> Tokenizer:
    """A stepserve model name or a local Hugging Face directory's tokenizer; UsageError
    when it cannot be loaded."""
    from stepserve.config.errors import UsageError

    try:
        from stepserve.model.presets import resolve_model
        from stepserve.model.tokenizer import Tokenizer
    except ImportError as e:
        raise UsageError(f"--tokenizer {name!r}: needs the model extra "
                         f"(pip install -e '.[model]'): {e}") from None
    try:
        return Tokenizer(resolve_model(name))
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokenizer {name!r}: {e}") from None


@dataclass
class Conversation:
    """One session's exchanges so far, which each later turn sends again in front of its
    new user message: a completions prompt is the text so far (prompts and answers
    joined, as a client continuing a transcript), a chat request the messages so far."""

    chat: bool
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)

    def body(self, shape: Any, model: str, user: str | list[int], max_tokens: int,
             ignore_eos: bool) -> dict[str, Any]:
        """The turn's request body (`shape`: bench/client.py's RequestShape)."""
        if not isinstance(user, str):
            raise TypeError("a conversation sends text prompts")
        if self.chat:
            out = shape.body(model, user, max_tokens, ignore_eos)
            out["messages"] = [*self.messages, *out["messages"]]
            return out
        return shape.body(model, self.text + user, max_tokens, ignore_eos)

    def answered(self, user: str, answer: str) -> None:
        """The turn that sent `user` was answered `answer`: both join the history, a space
        before the next user message (the model's answer is not assumed to end in one)."""
        self.messages += [{"role": "user", "content": user},
                          {"role": "assistant", "content": answer}]
        self.text += user + answer + " "


def repeated_tokens(specs: Sequence[RequestSpec]) -> list[int]:
    """For each spec, the prompt tokens an earlier one's prompt began with. The prompts
    share exactly their shared prefix, so that is the prefix of any spec
    whose prefix came before, in the whole blocks a cache could give. A trace's prompts
    share what their hash ids do (`repeated_trace_tokens`)."""
    if specs and all(isinstance(s, TraceSpec) for s in specs):
        return repeated_trace_tokens(specs)  # type: ignore[arg-type]
    seen: set[str] = set()
    out = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: specs[i].arrival_s):
        s = specs[i]
        if s.prefix in seen:
            out[i] = cacheable_tokens(s.prefix_len, s.prompt_len)
        if s.prefix is not None:
            seen.add(s.prefix)
    for k, nxt in next_turns(specs).items():  # a session's turn: the prompt before it, too
        out[nxt] = cacheable_tokens(specs[k].prompt_len, specs[nxt].prompt_len)
    return out


def repeated_trace_tokens(specs: Sequence[TraceSpec]) -> list[int]:
    """For each request, the leading prompt tokens an earlier one began with, from the
    hash ids alone (the prompts share exactly their common hash-id prefix, a cut last
    block as far as both have it), in the whole blocks a cache could give."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node: the prefixes
    covered: list[int] = [0]  # per node, the most tokens an earlier prompt had along it
    out = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: specs[i].arrival_s):
        s = specs[i]
        node, shared, path = 0, 0, []
        for depth, h in enumerate(s.hash_ids, start=1):
            child = nodes.get((node, h))
            if child is None:
                child = nodes[(node, h)] = len(covered)
                covered.append(0)
            elif shared == (depth - 1) * s.block_tokens:  # still on an earlier prompt
                shared = covered[child]
            node = child
            path.append((child, min(s.prompt_len, depth * s.block_tokens)))
        out[i] = cacheable_tokens(min(shared, s.prompt_len), s.prompt_len)
        for child, tokens in path:
            covered[child] = max(covered[child], tokens)
    return out
