"""Reading a request body without letting it stall the server: a byte limit (413), then
JSON parsing whose cost on the event loop is bounded, then validation.

Why not `model_validate_json(await request.body())`: the cost of parsing JSON grows with
the number of values, not bytes (a 2.4 MB body of `[[1,2],...]` took 0.26 s in json's C
parser and 0.79 s in pydantic's, all on the event loop while every stream waited), and
pydantic checks a list's `max_length` only after validating every item.

So: the number of JSON values is at most the number of structural characters
(`,` `[` `{`) plus one. A body under the value budget (enough for the longest legitimate
prompt plus every other bounded field) is parsed at once by the C parser, cheap by
construction. A body over it (string contents can hold those characters too) is counted
exactly, outside its strings, by a regex scan that stops as soon as the count passes the
budget, so its cost is bounded by the budget, not the body; it runs on a worker thread
and gives the GIL back every few milliseconds. Too many values: a 400. Otherwise the C
parser takes it. Only then does pydantic validate, over a bounded number of values.
Duplicate keys and the non-JSON constants NaN/Infinity are refused.
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.requests import Request

from stepserve.server.errors import APIError, bad_request

# Values a body may hold besides the prompt's token ids: 2,048 messages of a few values,
# 32 stop strings, 1,024 stop token ids, 300 logit biases and the scalar fields.
VALUE_SLACK = 16384

# One thread counts the values of heavy bodies: they queue rather than pile up.
_HEAVY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepserve-json")


class _BodyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _BodyError(f"duplicate key {dup!r} in a JSON object")
    return out


def _no_constant(name: str) -> Any:
    raise _BodyError(f"{name} is not valid JSON (numbers must be finite)")


_DECODER_HOOKS = dict(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)

# one token per match: a whole string (skipped: its content is not structure), or one of
# the characters that start a value
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{,]')


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
        raise _BodyError(f"the body holds more than {budget} JSON values; a request needs "
                         f"far fewer (a prompt of at most max_model_len token ids plus "
                         f"{VALUE_SLACK} for the other fields)")
    return json.loads(text, **_DECODER_HOOKS)


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to exceed `max_bytes`."""
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
    return b"".join(chunks)


async def parse_json(raw: bytes, value_budget: int) -> Any:
    """The body's JSON value; a 400 for invalid UTF-8 or JSON, or too many values."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the body is not valid UTF-8 (byte {e.start})", None,
                          "invalid_encoding") from None
    structural = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    try:
        if structural <= value_budget:
            return _parse(raw, text, value_budget, counted=True)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_HEAVY, _parse, raw, text, value_budget, False)
    except _BodyError as e:
        raise bad_request(str(e), None, "invalid_json") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e.msg} at line {e.lineno} column "
                          f"{e.colno}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("the body is not valid JSON here: nested too deeply", None,
                          "invalid_json") from None
