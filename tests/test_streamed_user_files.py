"""Files read as they stream: a trace line by line, a ShareGPT list item by item, each
bounded in lines and in the bytes of one line or item, so memory holds one record and
not the file; and a long turn is cut before it is tokenized."""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepserve.config import user_files
from stepserve.config.errors import UsageError
from stepserve.config.user_files import _ListReader, iter_json_list, read_lines
from stepserve.workload.errors import WorkloadError
from stepserve.workload.sharegpt import MAX_TOTAL_LEN, count_up_to
from stepserve.workload.trace import load_mooncake_trace, read_jsonl

MOONCAKE_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}'


def _first_item_before_the_writer_ends(tmp_path, first: str, rest: str, read):
    """Feed a FIFO `first`, hold it open until `read` has returned an item (or 30 s, a
    fail-safe), then write `rest` and close; whether the item came while it was open."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got_item = threading.Event()
    closed = threading.Event()

    def writer() -> None:
        with open(fifo, "w") as f:
            f.write(first)
            f.flush()
            got_item.wait(30)
            f.write(rest)
        closed.set()

    thread = threading.Thread(target=writer)
    thread.start()
    items = read(fifo)
    next(items)
    streamed = not closed.is_set()
    got_item.set()
    list(items)
    thread.join()
    return streamed


def test_a_trace_line_is_parsed_before_the_file_ends(tmp_path):
    assert _first_item_before_the_writer_ends(
        tmp_path, MOONCAKE_LINE + "\n", MOONCAKE_LINE + "\n",
        lambda p: read_jsonl(p, "trace"))


def test_a_json_list_item_is_parsed_before_the_file_ends(tmp_path):
    assert _first_item_before_the_writer_ends(
        tmp_path, '[{"conversations": []},', ' {"conversations": []}]',
        lambda p: iter_json_list(p, "sharegpt file", "of conversations"))


def test_blank_lines_count_toward_the_line_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(user_files, "MAX_FILE_LINES", 100, raising=False)
    path = tmp_path / "blank.jsonl"
    path.write_text("\n" * 150 + MOONCAKE_LINE + "\n")
    with pytest.raises(WorkloadError, match="more than the 100 lines a file may have "
                                            r"\(blank lines count\)"):
        load_mooncake_trace(path)
    path.write_text("\n" * 98 + MOONCAKE_LINE + "\n")
    assert len(load_mooncake_trace(path).specs) == 1


def test_a_line_longer_than_the_line_cap_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(user_files, "MAX_LINE_BYTES", 1000, raising=False)
    path = tmp_path / "long.jsonl"
    path.write_text(MOONCAKE_LINE + "\n" + " " * 5000 + MOONCAKE_LINE + "\n")
    with pytest.raises(WorkloadError, match="line 2: longer than the 1,000 bytes a line"):
        load_mooncake_trace(path)


def test_lines_keep_their_numbers_and_a_bad_byte_is_placed(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfa\r\n\nb\n")
    assert list(read_lines(path, "file")) == [(1, "a"), (2, ""), (3, "b")]
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(UsageError, match=r"line 2: not UTF-8 text \(byte 0xff at offset 3\)"):
        list(read_lines(path, "file"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(json_values, max_size=8), chunk=st.integers(1, 9),
       indent=st.sampled_from([None, 0, 2]))
def test_a_list_read_item_by_item_is_the_list_parsed_whole(tmp_path_factory, items, chunk,
                                                           indent):
    path = tmp_path_factory.mktemp("list") / "items.json"
    path.write_text(json.dumps(items, indent=indent, ensure_ascii=False))
    old, _ListReader.CHUNK = _ListReader.CHUNK, chunk  # items cut at every place
    try:
        assert list(iter_json_list(path, "file", "of items")) == items
    finally:
        _ListReader.CHUNK = old


@pytest.mark.parametrize("chunk", range(1, 12))
def test_a_number_cut_by_a_chunk_is_read_whole(tmp_path, monkeypatch, chunk):
    numbers = [1e-05, -0.0, 12345678901234567890, 1.5e300, -2.5e-7, True, None]
    path = tmp_path / "numbers.json"
    path.write_text(json.dumps(numbers))
    monkeypatch.setattr(_ListReader, "CHUNK", chunk)  # "1" then "e-05", "-" then "0.0"
    assert list(iter_json_list(path, "file", "of items")) == numbers


@pytest.mark.parametrize("text, words", [
    ("", "not valid JSON (Expecting value at line 1, column 1)"),
    ('{"a": 1}', "expected a JSON list of items, got a dict"),
    ("[1, 2", "not valid JSON (the file ends inside the list"),
    ("[1 2]", "not valid JSON (expected ',' or ']' after an item at line 1, column 4)"),
    ("[1]\n x", "not valid JSON (more after the list's closing ']' at line 2, column 2)"),
    ('[1,\n {"a": tru}]', "not valid JSON (Expecting value at line 2, column 8)"),
])
def test_a_bad_list_is_one_error_naming_where(tmp_path, text, words):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        list(iter_json_list(path, "file", "of items"))
    assert words in str(e.value) and "bad.json" in str(e.value)


def test_a_long_turn_is_counted_from_a_prefix_only():
    seen = []

    def count(text: str) -> int:  # one token a word, as a tokenizer would count "a a a"
        seen.append(len(text))
        return len(text.split())

    long_turn = "a " * 3_000_000
    assert count_up_to(long_turn, MAX_TOTAL_LEN, count) > MAX_TOTAL_LEN
    assert sum(seen) <= 16 * MAX_TOTAL_LEN  # characters tokenized, not six million
    short = "a " * MAX_TOTAL_LEN
    assert count_up_to(short, MAX_TOTAL_LEN, count) == MAX_TOTAL_LEN  # exact below it
    dense = "abcdefgh" * 4000  # 32,000 characters of one "token": doubled until whole
    assert count_up_to(dense, MAX_TOTAL_LEN, count) == 1
