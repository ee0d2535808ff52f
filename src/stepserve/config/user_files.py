"""Files the user names: reading theirs, checking before any work that an output can be
written, and writing outputs whole or not at all. Every failure is a `UsageError` naming
the file (and for JSON and YAML the line and column), so a mistake costs no lost run."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stepserve.config.errors import UsageError
from stepserve.config.limits import MAX_FILE_BYTES, MAX_FILE_LINES, MAX_LINE_BYTES
from stepserve.config.validate import preview  # noqa: F401  (how a message quotes a value)


def _open(path: Path, where: str):  # noqa: ANN202 (a binary file)
    """`path` opened to read bytes; UsageError naming it (`where`) when it cannot be."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise UsageError(f"{where}: cannot be read (no such file)") from None
    except IsADirectoryError:
        raise UsageError(f"{where}: cannot be read (it is a folder, not a file)") from None
    except OSError as e:
        raise UsageError(f"{where}: cannot be read ({e.strerror})") from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a user's file; `what` names it in messages ("workload file").
    At most MAX_FILE_BYTES are read, whatever the file claims (a pipe, /dev/zero)."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    with _open(p, where) as f:
        try:
            data = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise UsageError(f"{where}: cannot be read ({e.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{where}: more than the {MAX_FILE_BYTES:,} bytes a file may have")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, if any, is dropped
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start})") from None


def read_lines(path: str | Path, what: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a user's UTF-8 file as it is read, so memory
    holds one line, not the file. Every line counts toward MAX_FILE_LINES, blank ones
    too (a file of newlines is as costly to walk as one of requests); a line may hold
    MAX_LINE_BYTES, the file MAX_FILE_BYTES. UsageError naming the file (and line)."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    offset = 0
    with _open(p, where) as f:
        for number in range(1, MAX_FILE_LINES + 2):
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise UsageError(f"{where}: cannot be read ({e.strerror})") from None
            if not raw:
                return
            if number > MAX_FILE_LINES:
                raise UsageError(f"{where}: more than the {MAX_FILE_LINES:,} lines a file may "
                                 "have (blank lines count)")
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{where} line {number}: longer than the {MAX_LINE_BYTES:,} "
                                 "bytes a line may have")
            if offset + len(raw) > MAX_FILE_BYTES:
                raise UsageError(f"{where}: more than the {MAX_FILE_BYTES:,} bytes a file "
                                 "may have")
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(f"{where} line {number}: not UTF-8 text (byte "
                                 f"0x{raw[e.start]:02x} at offset {offset + e.start})") from None
            offset += len(raw)
            yield number, text.rstrip("\r\n")


def iter_json_list(path: str | Path, what: str, expected: str) -> Iterator[Any]:
    """The items of a user's file holding one JSON list, each parsed as it is read: the
    memory held is an item and a read-ahead, not the file (a 2 GiB ShareGPT file parsed
    whole takes several times that). An item may take MAX_LINE_BYTES characters.
    `expected` says what the list holds, for the message about a file that is no list.
    UsageError naming the file, the line and the column."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    reader = _ListReader(_open(p, where), where)
    with reader.file:
        yield from reader.items(expected)


_AFTER_NUMBER = frozenset(", \t\r\n]}")


class _ListReader:
    """A JSON list read in chunks: `buf[pos:]` is the text not parsed yet, `line` and
    `column` where `pos` stands in the file."""

    CHUNK = 1 << 20
    decoder = json.JSONDecoder()
    space = re.compile(r"[ \t\r\n]*")

    def __init__(self, file: Any, where: str) -> None:
        self.file, self.where = file, where
        self.text = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf, self.pos, self.eof = "", 0, False
        self.read_bytes, self.line, self.column = 0, 1, 1

    def more(self, at_least: int = 0) -> bool:
        """Append a chunk (at least `at_least` bytes) to what is left; False at the end."""
        if self.eof:
            return False
        try:
            data = self.file.read1(max(self.CHUNK, at_least))  # what is there: a pipe too
        except OSError as e:
            raise UsageError(f"{self.where}: cannot be read ({e.strerror})") from None
        self.read_bytes += len(data)
        if self.read_bytes > MAX_FILE_BYTES:
            raise UsageError(f"{self.where}: more than the {MAX_FILE_BYTES:,} bytes a file "
                             "may have")
        try:
            text = self.text.decode(data, final=not data)
        except UnicodeDecodeError as e:
            at = self.read_bytes - len(data) + max(e.start, 0)
            raise UsageError(f"{self.where}: not UTF-8 text (at byte offset {at})") from None
        self.buf, self.pos = self.buf[self.pos:] + text, 0
        self.eof = not data
        return bool(data)

    def advance(self, end: int) -> None:
        """Move `pos` to `end`, keeping its line and column."""
        newlines = self.buf.count("\n", self.pos, end)
        if newlines:
            self.line += newlines
            self.column = end - self.buf.rfind("\n", self.pos, end)
        else:
            self.column += end - self.pos
        self.pos = end

    def next_char(self) -> str:
        """The next character after any space ("" at the end of the file)."""
        while True:
            self.advance(self.space.match(self.buf, self.pos).end())
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def fail(self, problem: str, at: int | None = None) -> UsageError:
        line, column = self.line, self.column
        if at is not None:  # a place past pos, within the item being parsed
            newlines = self.buf.count("\n", self.pos, at)
            line += newlines
            column = at - self.buf.rfind("\n", self.pos, at) if newlines \
                else column + at - self.pos
        return UsageError(f"{self.where}: not valid JSON ({problem} at line {line}, column "
                          f"{column})")

    def items(self, expected: str) -> Iterator[Any]:
        if self.next_char() != "[":  # not JSON at all, or another kind of value
            other = type(self.item()).__name__
            raise UsageError(f"{self.where}: expected a JSON list {expected}, got a {other}")
        self.advance(self.pos + 1)
        if self.next_char() == "]":
            self.advance(self.pos + 1)
            self.end()
            return
        while True:
            yield self.item()
            sep = self.next_char()
            if sep == "]":
                self.advance(self.pos + 1)
                self.end()
                return
            if sep != ",":
                raise self.fail("expected ',' or ']' after an item" if sep
                                else "the file ends inside the list")
            self.advance(self.pos + 1)
            self.next_char()

    def item(self) -> Any:
        """The item at `pos`, reading on while it may be cut off by the chunk's end."""
        while True:
            held = len(self.buf) - self.pos
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.eof:
                    raise self.fail(e.msg, e.pos) from None
                if held > MAX_LINE_BYTES:
                    raise UsageError(f"{self.where}: the item at line {self.line}, column "
                                     f"{self.column} is not valid JSON within the "
                                     f"{MAX_LINE_BYTES:,} characters an item may have "
                                     f"({e.msg})") from None
                self.more(held)  # doubles what is held: an item is parsed O(log n) times
                continue
            except (RecursionError, ValueError) as e:  # nested too deeply; a huge number
                raise self.fail(f"{type(e).__name__}: {e}") from None
            if isinstance(value, (int, float)) and not self.eof and (
                    end == len(self.buf) or self.buf[end] not in _AFTER_NUMBER) \
                    and self.more():
                continue  # the chunk cut a number ("1" of "1e-5"): read it whole
            self.advance(end)
            return value

    def end(self) -> None:
        if self.next_char():
            raise self.fail("more after the list's closing ']'")


def load_json(path: str | Path, what: str) -> Any:
    """A user's JSON file, parsed; NaN and Infinity are read (our own writers may emit
    them), so callers that need finite numbers check."""
    return _parsed(path, what, json.loads, "JSON")


def load_yaml(path: str | Path, what: str) -> Any:
    """A user's YAML file, parsed (safe loader); a file whose aliases would repeat more
    than MAX_ALIAS_VALUES values, or hold a value inside itself, is refused unbuilt."""
    return _parsed(path, what, _parse_yaml, "YAML")


def _parsed(path: str | Path, what: str, parse: Callable[[str], Any], language: str) -> Any:
    """`parse` of the file's text; a UsageError names the file (and line, column)."""
    text = read_text(path, what)
    try:
        return parse(text)
    except json.JSONDecodeError as e:
        problem = f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        said = " ".join((getattr(e, "problem", None) or str(e)).split())
        problem = f"not valid YAML ({said}{where})"
    except (RecursionError, ValueError) as e:  # nested too deeply; a 5,000-digit number
        problem = f"not valid {language} ({type(e).__name__}: {e})"
    except _AliasBomb as e:
        problem = str(e)
    raise UsageError(f"{what} {str(path)!r}: {problem}") from None


# Aliases let a short file stand for a huge value (nine nested lists of ten aliases are a
# billion), which any walk or message over the value then expands. Merging shared
# defaults into each class repeats a few hundred values at most.
MAX_ALIAS_VALUES = 100_000


class _AliasBomb(Exception):
    """The file's aliases expand too far, or a value contains itself."""


def _parse_yaml(text: str) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}
        repeated = _expanded_size(node, sizes, set()) - len(sizes)
        if repeated > MAX_ALIAS_VALUES:
            raise _AliasBomb(f"its aliases (*name) repeat {repeated:,} values, more than "
                             f"the {MAX_ALIAS_VALUES:,} allowed; write the values out")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values `node` holds with every alias written out (each distinct node
    sized once: a node an alias shares keeps its size in `sizes`)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        mark = node.start_mark
        raise _AliasBomb(f"the value at line {mark.line + 1}, column {mark.column + 1} "
                         "contains an alias of itself; a value cannot hold itself")
    open_.add(key)
    children = node.value if isinstance(node, yaml.SequenceNode) else \
        [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) \
        else []
    total = 1 + sum(_expanded_size(child, sizes, open_) for child in children)
    open_.discard(key)
    sizes[key] = total
    return total


def check_output_file(flag: str, path: str | Path | None) -> None:
    """Refuse an output file that could not be written, before the work that fills it:
    a folder, a missing parent folder, or no permission. Writes nothing."""
    if path is None:
        return
    p = Path(path)
    where = f"{flag} {str(p)!r}"
    if p.is_dir():
        raise UsageError(f"{where}: is a folder; give the path of a file to write")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise UsageError(f"{where}: cannot be written, its folder {str(parent)!r} {what}")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{where}: cannot be written (no permission)")
    if not os.access(parent, os.W_OK | os.X_OK):  # write_atomic creates a file beside it
        raise UsageError(f"{where}: cannot be written, no permission to create files in "
                         f"{str(parent)!r}")


def check_output_dir(flag: str, path: str | Path | None) -> None:
    """Refuse an output folder that could not be created or written (it may not exist
    yet: the writer creates it and its parents). Writes nothing."""
    if path is None:
        return
    p = Path(path)
    where = f"{flag} {str(p)!r}"
    if p.exists() and not p.is_dir():
        raise UsageError(f"{where}: is a file, expected a folder")
    existing = p
    while not existing.exists():  # the writer creates the missing ones
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{where}: cannot be created, {str(existing)!r} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: cannot be written, no permission in {str(existing)!r}")


def write_atomic(path: str | Path, text: str) -> None:
    """`text` (UTF-8) as the file at `path` (through a link, the file it names), whole or
    not at all: a temporary file beside it, fsynced, renamed over it. On failure what
    `path` held is left as it was and the OSError raised."""
    target = Path(os.path.realpath(path))
    data = text.encode("utf-8")
    tmp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o666)  # less the umask, as a new file gets
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its mode
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass(frozen=True)
class OutputFile:
    """One output a command was asked for: the flag that named it, its path, and what
    writes it there (returning the path written where that is not `path`)."""

    flag: str
    path: str | Path | None  # None: not asked for, skipped
    write: Callable[[str | Path], object]

    @classmethod
    def text(cls, flag: str, path: str | Path | None, render: Callable[[], str]
             ) -> OutputFile:
        return cls(flag, path, lambda p: write_atomic(p, render()))


def write_outputs(outputs: Iterable[OutputFile]) -> str | None:
    """Write every output, whatever became of the ones before, printing `wrote PATH`; one
    line naming each that failed and why (None when all were written)."""
    failed = []
    for out in outputs:
        if out.path is None:
            continue
        try:
            written = out.write(out.path)
        except OSError as e:
            failed.append(f"{out.flag} {str(out.path)!r} not written ({e.strerror or e})")
            continue
        print(f"wrote {written or out.path}")
    return "; ".join(failed) + " (a file is written whole or not at all: one that was " \
        "there before is unchanged)" if failed else None
