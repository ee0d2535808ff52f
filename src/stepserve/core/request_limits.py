"""The bounds of every request input, in one place: `SamplingParams` and the HTTP models
(server/protocol.py) read their ranges here, so what the API accepts the engine can run
and a hostile value is refused at the edge, naming the field and the range.

Integers reaching torch stay in int64; stop strings are searched after every token, so
they are bounded; each of `n` children holds a sequence of KV; text must be valid
Unicode (a lone surrogate cannot be tokenized, logged or sent); a min_tokens request
whose stop set covers the vocabulary could sample nothing (`stop_tokens_refusal`).
"""

from __future__ import annotations

from functools import lru_cache

from stepserve.config.validate import Allowed

INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1

MAX_TOKENS_MAX = INT32_MAX  # the engine refuses anything over max_model_len anyway
TEMPERATURE_MAX = 2.0  # OpenAI's range
TOP_K_MAX = 1 << 20  # above every vocabulary; -1 and 0 mean "off"
SEED_MIN, SEED_MAX = -(1 << 63), INT64_MAX  # OpenAI's seed is an int64
PRIORITY_MIN, PRIORITY_MAX = -INT32_MAX - 1, INT32_MAX
STOP_MAX_COUNT = 32  # OpenAI allows 4; vLLM has no limit
STOP_MAX_CHARS = 1024  # per stop string
STOP_TOKEN_IDS_MAX_COUNT = 1024
TENANT_MAX_CHARS = 256  # the `user` field
N_MAX = 128  # parallel samples of one request (each holds its own KV; vLLM allows 16384)
PROMPTS_MAX_COUNT = 256  # prompts of one completions request (each queues as a request)
# top logprobs per token: an engine allows DEFAULT_MAX_LOGPROBS (vLLM's --max-logprobs
# default, OpenAI's 20) unless told more; none may allow more than every vocabulary
DEFAULT_MAX_LOGPROBS = 20
LOGPROBS_MAX = TOP_K_MAX
PENALTY_MIN, PENALTY_MAX = -2.0, 2.0  # presence / frequency (OpenAI's and vLLM's range)
REPETITION_PENALTY_MAX = 100.0  # vLLM: any finite value > 0; past ~2 it only scrambles
REQUEST_ID_MAX_CHARS = 256  # a client's request_id (vLLM extra field) or X-Request-Id
MESSAGES_MAX_COUNT = 2048  # chat messages per request
# `cache_salt`: a namespace's name, hashed once per request (vLLM: any non-empty string)
CACHE_SALT_MAX_CHARS = 1024
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_REQUEST_BYTES_MAX = 1 << 30


def check_range(name: str, value: object, low: float | None, high: float | None,
                *, integer: bool = False, low_open: bool = False,
                note: str = "") -> str | None:
    """A problem if `value` is not a number in [low, high] (`low_open`: (low, high]);
    None: fine. NaN, infinities and bools fail."""
    return _allowed(low, high, int if integer else float, low_open, note).problem(name, value)


@lru_cache(maxsize=256)
def _allowed(low: float | None, high: float | None, kind: type, low_open: bool,
             note: str) -> Allowed:
    """Each range's Allowed, made once."""
    return Allowed(low, high, kind, lo_open=low_open, note=note)


def check_text(field: str, text: str) -> str | None:
    """A problem if `text` holds a lone surrogate (None: fine); never quotes the text,
    which could not be printed either."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        byte = f"; U+{code:04X} is also how Python reads the byte 0x{code - 0xDC00:02X}, " \
            "which is not UTF-8" if 0xDC80 <= code <= 0xDCFF else ""
        return (f"{field}: the character at index {e.start} is a lone surrogate "
                f"(U+{code:04X}); text must be valid Unicode, where a surrogate is only "
                f"half of a pair (in JSON, a \\ud800-\\udbff escape followed by a "
                f"\\udc00-\\udfff one{byte})")
    return None


def stop_tokens_refusal(stop_token_ids: tuple[int, ...] | list[int], min_tokens: int,
                        vocab_size: int, eos_token_id: int | None) -> str | None:
    """Why these stop ids cannot be taken (None: they can): an id outside the vocabulary,
    or, with min_tokens, a stop set masking every token (EOS too, as vLLM)."""
    token_id = Allowed(0, vocab_size, hi_open=True)
    for i, t in enumerate(stop_token_ids):
        if (problem := token_id.problem(f"stop_token_ids[{i}]", t)) is not None:
            return problem
    if min_tokens <= 0 or len(stop_token_ids) + 1 < vocab_size:
        return None
    masked = set(stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
    if len(masked) < vocab_size:
        return None
    eos = f" and EOS (id {eos_token_id})" if eos_token_id is not None else ""
    return (f"stop_token_ids{eos} cover the whole vocabulary of {vocab_size} tokens, and "
            f"min_tokens = {min_tokens} masks them all until then: nothing could be "
            f"generated; leave some tokens out of stop_token_ids or set min_tokens = 0")


def cache_salt_refusal(cache_salt: object) -> str | None:
    """Why `cache_salt` cannot be taken (None: it can): a bounded non-empty string."""
    if cache_salt is None:
        return None
    if not isinstance(cache_salt, str) or not cache_salt:
        return f"cache_salt = {cache_salt!r:.80}: must be a non-empty string (or none)"
    if len(cache_salt) > CACHE_SALT_MAX_CHARS:
        return (f"cache_salt: {len(cache_salt)} characters, at most {CACHE_SALT_MAX_CHARS} "
                "allowed")
    return check_text("cache_salt", cache_salt)


def priority_refusal(priority: int, policy: str) -> str | None:
    """Why `priority` cannot be taken under `policy` (None: it can); vLLM refuses it
    under fcfs rather than ignore it."""
    if not priority or policy == "priority":
        return None
    return (f"priority = {priority}, but the scheduling policy is {policy!r}: priority is "
            "only taken under the priority policy (--scheduling-policy priority, or "
            "LLM(..., scheduling_policy='priority'))")

