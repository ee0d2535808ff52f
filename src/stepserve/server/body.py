"""Reading a request body without letting it stall the server: a byte limit (413), JSON
parsing whose cost on the event loop is bounded, then strict validation.

Parsing costs by the number of values, not bytes (a 2.4 MB body of `[[1,2],...]` took
0.26 s in json's C parser, 0.79 s in pydantic's), so the values are bounded first: at
most the structural characters (`,` `[` `{`) plus one. A body of at most INLINE_VALUES
is parsed on the event loop; a larger one on a worker thread, counted exactly (outside
strings) when it may exceed the value budget. Duplicate keys and NaN/Infinity are
refused, and so, naming the value's JSON path in `param`, are an integer literal longer
than any field takes (int() is quadratic in its digits: 4,300-digit literals held the
loop 0.27 s) and a lone surrogate (`\\ud800`), which nothing downstream can carry.
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from stepserve.core.request_limits import check_text
from stepserve.server.errors import APIError, bad_request, from_validation_error

if TYPE_CHECKING:
    from stepserve.server.serving import ServingContext

M = TypeVar("M", bound=BaseModel)

# Values a body may hold besides the prompt's token ids: 2,048 messages of a few values,
# 32 stop strings, 1,024 stop token ids, 300 logit biases and the scalar fields.
VALUE_SLACK = 16384

# Bodies of at most this many values are parsed on the event loop (a few ms at most,
# with the int hook's Python call per integer); larger ones on the worker thread.
INLINE_VALUES = 4096

# The widest integer field is a 64-bit seed: 19 digits (and a sign).
INT_LITERAL_MAX_DIGITS = 20

# One thread parses the heavy bodies: they queue rather than pile up.
_HEAVY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepserve-json")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()  # a set, not keys.count: linear in the object's size
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise bad_request(f"duplicate key {dup[:64]!r} in a JSON object", None, "invalid_json")
    return out


def _no_constant(name: str) -> Any:
    raise bad_request(f"{name} is not valid JSON (numbers must be finite)", None,
                      "invalid_json")


class _LongLiteral:
    """Where an integer literal of more than INT_LITERAL_MAX_DIGITS digits was: kept in
    its value's place so the walk can name the field."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


# one token per match: a whole string (skipped: its content is not structure), or one of
# the characters that start a value
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{,]')

# an escape that may decode to half of a surrogate pair (\uD800-\uDFFF)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _too_many_values(raw: bytes, budget: int) -> bool:
    """Whether `raw` holds more than `budget` values (counting stops once it knows)."""
    count = 1
    for m in _TOKENS.finditer(raw):
        if m.end() - m.start() == 1:  # a string match is at least 2 bytes ("")
            count += 1
            if count > budget:
                return True
    return False


def _parse(raw: bytes, text: str, budget: int, counted: bool) -> Any:
    if not counted and _too_many_values(raw, budget):
        raise bad_request(f"the body holds more than {budget} JSON values; a request needs "
                          f"far fewer (a prompt of at most max_model_len token ids plus "
                          f"{VALUE_SLACK} for the other fields)", None, "invalid_json")
    long_literals: list[_LongLiteral] = []

    def bounded_int(literal: str) -> int | _LongLiteral:
        digits = len(literal) - (literal[0] == "-")
        if digits <= INT_LITERAL_MAX_DIGITS:
            return int(literal)
        long_literals.append(_LongLiteral(digits))
        return long_literals[-1]

    value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                       parse_int=bounded_int)
    if long_literals or _SURROGATE_ESCAPE.search(raw):
        _check_values(value)
    return value


def _check_values(value: Any) -> None:
    """Each string valid Unicode and each integer literal within bounds, or the first
    one that is not (in document order) as a 400 naming its path; the walk is over a
    value already bounded in size (the value budget)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(path, item)
        elif isinstance(item, _LongLiteral):
            where = ".".join(path) or None
            raise bad_request(f"{where or 'the body'}: an integer literal of {item.digits} "
                              f"digits; no field takes one of more than "
                              f"{INT_LITERAL_MAX_DIGITS} digits (the widest, seed, is a "
                              f"64-bit integer)", where)
        elif isinstance(item, dict):
            for key in item:
                _check_text(path, key, "a key of ")
            stack.extend((v, (*path, k[:64])) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, (*path, str(i))) for i, v in reversed(list(enumerate(item)))
                         if isinstance(v, (str, list, dict, _LongLiteral)))


def _check_text(path: tuple[str, ...], text: str, what: str = "") -> None:
    if text.isascii():
        return
    where = ".".join(path) or None
    problem = check_text(what + (where or "the body"), text)
    if problem:
        raise bad_request(problem, where)


async def read_json(ctx: ServingContext, request: Request) -> Any:
    """The body's JSON value: 415 unless it is uncompressed JSON, 413 as soon as it is
    known to exceed --max-request-bytes (the limits below count the bytes as sent), a
    400 for what parse_json refuses."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype!r}",
                       param=None, code="unsupported_media_type")
    check_content_encoding(request.headers.get("content-encoding"))
    max_bytes = ctx.max_request_bytes
    too_big = APIError(413, f"the request body exceeds {max_bytes} bytes (the server's "
                            f"--max-request-bytes)", param=None, code="body_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_big
        chunks.append(chunk)
    return await parse_json(b"".join(chunks), ctx.max_model_len + VALUE_SLACK)


def validate(data: object, model: type[M]) -> M:
    """Strict validation of a parsed body; a 400 naming the first problem."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        raise from_validation_error(e) from None


async def parse_body(ctx: ServingContext, request: Request, model: type[M]) -> M:
    return validate(await read_json(ctx, request), model)


def check_content_encoding(encoding: str | None) -> None:
    """Only identity: a compressed body would otherwise be read as text ("not valid
    UTF-8"), and inflating one would escape the byte limit."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return
    raise APIError(415, f"Content-Encoding {encoding[:64]!r} is not supported: send the "
                        f"body uncompressed (only 'identity' is accepted)",
                   param=None, code="unsupported_media_type")


async def parse_json(raw: bytes, value_budget: int) -> Any:
    """The body's JSON value; a 400 for invalid UTF-8 or JSON, too many values, an
    integer literal too long for any field, or a lone surrogate in a string."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the body is not valid UTF-8 (byte {e.start})", None,
                          "invalid_encoding") from None
    structural = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    try:
        if structural <= min(INLINE_VALUES, value_budget):
            return _parse(raw, text, value_budget, counted=True)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_HEAVY, _parse, raw, text, value_budget,
                                          structural <= value_budget)
    except json.JSONDecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e.msg} at line {e.lineno} column "
                          f"{e.colno}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("the body is not valid JSON here: nested too deeply", None,
                          "invalid_json") from None
