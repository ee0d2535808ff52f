"""`WorkloadError` and the small checks every workload reader shares. Every message has
`ConfigError`'s shape, `field = value: what is allowed`, so a user can fix a YAML file
from the message alone; upper bounds come from limits.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from stepserve.config.errors import UsageError
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed

T = TypeVar("T")


class WorkloadError(UsageError):
    """A workload, length distribution, arrival process or trace is malformed."""


def read_user_file(read: Callable[[Path, str], T], path: Path, what: str) -> T:
    """`read(path, what)`, a reader of config/user_files.py, refusing with WorkloadError."""
    try:
        return read(path, what)
    except UsageError as e:
        raise WorkloadError(str(e)) from None


def read_user_items(items: Iterator[T]) -> Iterator[T]:
    """The items of a streaming reader of config/user_files.py, refusing with
    WorkloadError."""
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except UsageError as e:
            raise WorkloadError(str(e)) from None
        yield item


def check_int(field: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (bools are not integers here) in [lo, hi], either end optional."""
    return Allowed(lo, hi).check(field, value, WorkloadError)


def check_positive(field: str, value: Any, *, allow_zero: bool = False,
                   hi: float | None = None) -> float:
    """A finite number > 0 (or >= 0), at most `hi` if given, returned as float."""
    return Allowed(0, hi, float, lo_open=not allow_zero).check(field, value, WorkloadError)


def check_range(field: str, value: Any, lo: float, hi: float) -> float:
    return Allowed(lo, hi, float).check(field, value, WorkloadError)


def check_str(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise WorkloadError(f"{field} = {preview(value)}: must be a non-empty string")
    return value


def check_mapping(field: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{field} = {preview(value)}: must be a mapping (key: value)")
    return value


def check_keys(field: str, data: Mapping[str, Any], allowed: Iterable[str],
               required: Iterable[str] = ()) -> None:
    """Reject unknown keys (listing the allowed ones) and missing required keys."""
    allowed = list(allowed)
    for key in data:
        if key not in allowed:
            raise WorkloadError(f"{field}: unknown key {preview(key)}; allowed keys: "
                                f"{', '.join(allowed)}")
    for key in required:
        if key not in data:
            raise WorkloadError(f"{field}: missing required key {preview(key)}")


def keyed(field: str, data: Any, keys: tuple[str, ...],
          required: tuple[str, ...] | None = None) -> Mapping[str, Any]:
    """A mapping with only `keys`, and all of `required` (default: all of them)."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{field} = {preview(data)}: must be a mapping with keys "
                            f"{', '.join(keys)}")
    check_keys(field, data, keys, keys if required is None else required)
    return data


def one_key(field: str, data: Any, choices: Iterable[str]) -> tuple[str, Any]:
    """A mapping with exactly one key out of `choices`: returns (key, value)."""
    choices = list(choices)
    if not isinstance(data, Mapping) or len(data) != 1:
        raise WorkloadError(f"{field} = {preview(data)}: must be a mapping with exactly one "
                            f"of: {', '.join(choices)}")
    ((key, value),) = data.items()
    check_keys(field, data, choices)
    return key, value


@contextmanager
def located(where: str) -> Iterator[None]:
    """A WorkloadError raised inside gets the YAML path in front, e.g.
    `classes[1].output.lognormal...`; one whose message starts with " =" or ":" (from
    `one_key("")`) is about `where` itself."""
    try:
        yield
    except WorkloadError as e:
        text = str(e)
        if not where:
            text = text.lstrip(" :")
        elif text.startswith((" ", ":")):
            text = where + text
        else:
            text = f"{where}.{text}"
        raise WorkloadError(text) from None


def resolved(path: str, base_dir: Path | None) -> Path:
    """A file named in a workload: a relative path is the workload file's folder's."""
    p = Path(path)
    return base_dir / p if base_dir is not None and not p.is_absolute() else p
