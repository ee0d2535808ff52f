"""Files the user names: reading theirs (results, workloads, configs, traces, ShareGPT)
and checking, before any work is done, that an output path can be written.

Every failure is a `UsageError` that names the file (and, for JSON and YAML, the line
and column), so a mistake costs one line and no lost run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from stepserve.cli_errors import UsageError
from stepserve.limits import MAX_FILE_BYTES


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a user's file; `what` names it in messages ("workload file").
    At most MAX_FILE_BYTES are read, whatever the file claims (a pipe, /dev/zero)."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{where}: cannot be read (no such file)") from None
    except IsADirectoryError:
        raise UsageError(f"{where}: cannot be read (it is a folder, not a file)") from None
    except OSError as e:
        raise UsageError(f"{where}: cannot be read ({e.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{where}: more than the {MAX_FILE_BYTES:,} bytes a file may have")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, if any, is dropped
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start})") from None


def json_error(e: json.JSONDecodeError) -> str:
    return f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"


def load_json(path: str | Path, what: str) -> Any:
    """A user's JSON file, parsed. NaN and Infinity are read as Python reads them (our own
    writers may emit them); callers that need finite numbers check their values."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {str(path)!r}: {json_error(e)}") from None
    except (RecursionError, ValueError) as e:  # nested too deeply; a 5,000-digit number
        raise UsageError(f"{what} {str(path)!r}: not valid JSON ({type(e).__name__}: "
                         f"{e})") from None


def yaml_error(e: yaml.YAMLError) -> str:
    """One line: the parser's problem and where it is (1-based, as editors count)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML ({' '.join(problem.split())}{where})"


def load_yaml(path: str | Path, what: str) -> Any:
    """A user's YAML file, parsed (safe_load: plain data only)."""
    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{what} {str(path)!r}: {yaml_error(e)}") from None
    except (RecursionError, ValueError) as e:  # nested too deeply; a 5,000-digit number
        raise UsageError(f"{what} {str(path)!r}: not valid YAML ({type(e).__name__}: "
                         f"{e})") from None


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
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
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
