"""The body parser's own refusals (server/body.py), on both of its paths (a small body
parsed on the event loop, a large one on the worker thread): an integer literal longer
than any field takes, a lone surrogate anywhere, a compressed body; each names where."""

from __future__ import annotations

import asyncio
import json

import pytest

from stepserve.server.body import (
    INLINE_VALUES,
    INT_LITERAL_MAX_DIGITS,
    check_content_encoding,
    parse_json,
)
from stepserve.server.errors import APIError

BUDGET = 256 + 16384  # the value budget of a server with max_model_len 256
PADDING = list(range(INLINE_VALUES))  # enough values to send a body to the worker thread


def parse(raw: bytes):
    return asyncio.run(parse_json(raw, BUDGET))


def refusal(raw: bytes) -> APIError:
    with pytest.raises(APIError) as info:
        parse(raw)
    return info.value


def bodies(field: str, literal: str) -> list[bytes]:
    """`{"prompt": ..., field: literal}` small (the inline path) and large (the worker's)."""
    return [f'{{"prompt": {json.dumps(prompt)}, "{field}": {literal}}}'.encode()
            for prompt in ([1, 2], PADDING)]


@pytest.mark.parametrize("path", ["inline", "worker"])
def test_an_integer_literal_past_pythons_limit_is_a_400_naming_its_field(path):
    raw = bodies("max_tokens", "9" * 5000)[path == "worker"]
    err = refusal(raw)
    assert (err.status, err.param, err.code) == (400, "max_tokens", "invalid_value")
    assert "5000 digits" in err.message


@pytest.mark.parametrize("path", ["inline", "worker"])
def test_a_literal_one_digit_too_long_is_refused_and_the_longest_allowed_parses(path):
    i = path == "worker"
    too_long = "-" + "9" * (INT_LITERAL_MAX_DIGITS + 1)
    assert refusal(bodies("seed", too_long)[i]).param == "seed"
    longest = "-" + "9" * INT_LITERAL_MAX_DIGITS
    assert parse(bodies("seed", longest)[i])["seed"] == int(longest)


def test_a_long_literal_deep_in_a_list_is_named_by_its_path():
    raw = b'{"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [1, 2, ' \
        + b"1" * 40 + b"]}"
    assert refusal(raw).param == "stop_token_ids.2"


@pytest.mark.parametrize("path", ["inline", "worker"])
def test_a_lone_surrogate_is_a_400_naming_the_strings_path(path):
    messages = '[{"role": "user", "content": [{"type": "text", "text": "ab\\ud800cd"}]}]'
    err = refusal(bodies("messages", messages)[path == "worker"])
    assert (err.status, err.param, err.code) == (400, "messages.0.content.0.text",
                                                 "invalid_value")
    assert "lone surrogate (U+D800)" in err.message and "index 2" in err.message


@pytest.mark.parametrize("raw, param", [
    (b'{"prompt": "\\udc80"}', "prompt"),  # a low half alone
    (b'{"prompt": "\\ud800\\ud800\\udc00"}', "prompt"),  # a high half, then a pair
    (b'{"prompt": "\\udc00\\ud800"}', "prompt"),  # the halves in the wrong order
    (b'{"prompt": "x", "stop": ["a", "b\\uDBFF"]}', "stop.1"),  # upper-case escape
    (b'{"prompt": "x", "\\ud800": 1}', None),  # a key: named by its object, the body
    (b'"\\ud800"', None),  # the whole body
])
def test_every_lone_surrogate_is_found(raw, param):
    err = refusal(raw)
    assert err.status == 400 and err.param == param, err.message
    assert "lone surrogate" in err.message


def test_valid_pairs_and_text_are_untouched():
    raw = b'{"prompt": "caf\\u00e9 \\ud83d\\ude00 \\\\ud800 is text", "n": 1}'
    assert parse(raw) == {"prompt": "café \U0001F600 \\ud800 is text", "n": 1}


def test_a_duplicate_key_is_found_without_a_quadratic_search():
    keys = [f"k{i}" for i in range(INLINE_VALUES)]
    raw = ("{" + ",".join(f'"{k}": 1' for k in [*keys, keys[-1]]) + "}").encode()
    err = refusal(raw)
    assert err.status == 400 and repr(keys[-1]) in err.message


@pytest.mark.parametrize("encoding", [None, "", "identity", " Identity "])
def test_an_uncompressed_body_is_read(encoding):
    check_content_encoding(encoding)


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate", "gzip, identity"])
def test_a_compressed_body_is_a_415_naming_the_encoding(encoding):
    with pytest.raises(APIError) as info:
        check_content_encoding(encoding)
    err = info.value
    assert (err.status, err.code) == (415, "unsupported_media_type")
    assert repr(encoding) in err.message and "identity" in err.message
