"""Request lengths from a ShareGPT-style JSON file (as vLLM's serving benchmark reads one):
a list of conversations `{"conversations": [{"from": "human", "value": ...}, {"from":
"gpt", ...}]}` (also `role`/`content`, `conversation`). The first two turns' token
lengths become (prompt, output) pairs a class samples jointly, so a long question keeps
its long answer; pairs are dropped as vLLM drops them and the drops counted. Prompts
themselves are not kept (the bench sends prompts of the counted length), so the prefix
cache finds nothing to reuse in a ShareGPT run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepserve.config.limits import MAX_LEN
from stepserve.config.user_files import iter_json_list
from stepserve.core.request_limits import check_text
from stepserve.workload.errors import WorkloadError, check_int, read_user_items
from stepserve.workload.lengths import Empirical
from stepserve.workload.spec import RequestClass

MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ShareGPT:
    """The pairs read from one file, and how they were counted and filtered."""

    path: str
    pairs: tuple[tuple[int, int], ...]
    counted_by: str  # "tokenizer NAME" or "estimate (4 characters per token)"
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> conversations

    def describe(self) -> str:
        dropped = ", ".join(f"{n} {why}" for why, n in self.dropped.items())
        return (f"sharegpt {self.path}: {len(self.pairs)} conversations, lengths by "
                f"{self.counted_by}" + (f"; dropped {dropped}" if dropped else ""))


def _turn_text(turn: Any) -> str | None:
    if not isinstance(turn, dict):
        return None
    text = turn.get("value", turn.get("content"))
    return text if isinstance(text, str) else None


def _counter(tokenizer: str | None) -> tuple[Callable[[str], int], str]:
    if tokenizer is None:
        return (lambda text: max(1, -(-len(text) // CHARS_PER_TOKEN)),
                f"estimate ({CHARS_PER_TOKEN} characters per token; give a tokenizer for "
                "exact counts)")
    try:
        from stepserve.model.presets import resolve_model
        from stepserve.model.tokenizer import Tokenizer

        tok = Tokenizer(resolve_model(tokenizer))
    except ImportError as e:
        raise WorkloadError(f"tokenizer {tokenizer!r}: needs the model extra "
                            f"(pip install -e '.[model]'): {e}") from None
    except (OSError, ValueError) as e:
        raise WorkloadError(f"tokenizer {tokenizer!r}: {e}") from None
    return (lambda text: count_up_to(text, MAX_TOTAL_LEN, lambda t: len(
        tok.encode(t, add_special_tokens=False)))), f"tokenizer {tokenizer}"


def count_up_to(text: str, limit: int, count: Callable[[str], int]) -> int:
    """`count(text)` where it is at most `limit`, else some number above `limit`, having
    tokenized no more than a few times `limit` tokens' worth of text: a prefix, doubled
    while it is short of the limit (a token is at most a vocabulary entry long, so a
    long enough prefix holds more than `limit` tokens). Only whether a turn passes the
    limit matters for one that long, and tokenizing three million words to find out took
    seconds and gigabytes."""
    chars = (limit + 2) * CHARS_PER_TOKEN
    while True:
        if len(text) <= chars:
            return count(text)
        n = count(text[:chars])
        if n > limit + 1:  # the prefix's last token may be cut in two: +1
            return n
        chars *= 2


def load_sharegpt(path: str | Path, tokenizer: str | None = None,
                  output_len: int | None = None) -> ShareGPT:
    """Read, count and filter; WorkloadError says what is wrong with the file."""
    p = Path(path)
    where = f"sharegpt file {str(p)!r}"
    if output_len is not None:
        check_int("output_len", output_len, lo=1, hi=MAX_LEN)
    count, counted_by = _counter(tokenizer)
    pairs: list[tuple[int, int]] = []
    dropped: Counter[str] = Counter()
    # parsed a conversation at a time: a whole file's objects take several times its size
    items = read_user_items(iter_json_list(p, "sharegpt file", "of conversations "
                                           '[{"conversations": [{"from": "human", "value": '
                                           "...}, ...]}]"))
    for i, item in enumerate(items):
        turns = item.get("conversations", item.get("conversation")) \
            if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            dropped["without two turns"] += 1
            continue
        prompt, completion = _turn_text(turns[0]), _turn_text(turns[1])
        if prompt is None or completion is None:
            dropped["without a text value"] += 1
            continue
        for turn, text in (("prompt", prompt), ("completion", completion)):
            # refused with or without a tokenizer: a file is usable or not, whichever counts
            problem = check_text(f"{where}: conversation {i}, its {turn} turn", text)
            if problem:
                raise WorkloadError(problem)
        n_prompt = count(prompt)
        n_output = output_len if output_len is not None else count(completion)
        if n_prompt < MIN_LEN or n_output < MIN_LEN:
            dropped[f"under {MIN_LEN} tokens"] += 1
        elif n_prompt > MAX_PROMPT_LEN or n_prompt + n_output > MAX_TOTAL_LEN:
            dropped[f"over {MAX_PROMPT_LEN} prompt / {MAX_TOTAL_LEN} total tokens"] += 1
        else:
            pairs.append((n_prompt, n_output))
    if not pairs:
        why = ", ".join(f"{n} {reason}" for reason, n in dropped.items()) or "it is empty"
        raise WorkloadError(f"{where}: no usable conversation ({why}); each needs a prompt "
                            f"and a completion turn of {MIN_LEN}..{MAX_PROMPT_LEN} tokens")
    return ShareGPT(str(p), tuple(pairs), counted_by, dict(dropped))


def sharegpt_class(path: str | Path, tokenizer: str | None = None,
                   output_len: int | None = None, name: str = "sharegpt",
                   share: float = 1.0, **options: Any) -> RequestClass:
    """A request class drawing (prompt, output) pairs from the file; `options` are the
    other RequestClass fields (max_tokens, priority, tenant, length_estimate)."""
    data = load_sharegpt(path, tokenizer, output_len)
    given = {"file": str(path), "tokenizer": tokenizer, "output_len": output_len}
    dataset = {k: v for k, v in given.items() if v is not None}
    return RequestClass(
        name, share, Empirical(tuple(p for p, _ in data.pairs)),
        Empirical(tuple(o for _, o in data.pairs)), pairs=data.pairs,
        dataset={**dataset, "description": data.describe()}, **options)
