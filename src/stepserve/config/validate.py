"""The one validator of a user's number, range or choice (each layer keeps its own error
type), and the one refusal: `max_num_seqs = 0: must be an integer in [1, 65536]`.

Kinds: `int` (a bool is not an integer), `float` (an int or float, returned as float;
NaN never, infinity only with `inf_ok`), `bool`, `str` (with `choices`: one of them)."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from typing import Any

from stepserve.config.errors import UsageError

# A message quotes a user's value by its first characters: the value may be a whole
# file's worth of list (aliases or not), and its full repr would be the message.
PREVIEW_CHARS = 60
_KIND_NAMES = {int: "an integer", float: "a finite number", bool: "true or false",
               str: "a string"}


class _Preview(reprlib.Repr):
    """repr with every container cut to its first few items, nested at most three deep."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 4
        self.maxstring = self.maxother = PREVIEW_CHARS

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:  # repr of a 5,000-digit int is an error, not a string
            return f"<an integer of {x.bit_length():,} bits>"
        return super().repr_int(x, level)


_PREVIEW = _Preview()


def preview(value: Any) -> str:
    """`repr(value)` in at most PREVIEW_CHARS characters (cut with '...'), however large."""
    text = _PREVIEW.repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:.10g}"


@dataclass(frozen=True)
class Allowed:
    """What one value may be: its kind and bounds (both ends included unless `lo_open` /
    `hi_open`; None: unbounded), or for strings a set of `choices`. `optional`: None is
    also allowed. `note` ends the description, e.g. " (0 or -1: off)"."""

    lo: float | None = None
    hi: float | None = None
    kind: type = int
    inf_ok: bool = False
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False
    note: str = ""

    def describe(self) -> str:
        """`an integer in [1, 65536]`, `a finite number > 0`, `one of a, b (or null)`."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        else:
            text = _KIND_NAMES[self.kind] + self._span()
        if self.inf_ok:
            text += " (or inf)"
        if self.optional:
            text += " (or null)"
        return text + self.note

    def _span(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return (f" in {'(' if self.lo_open else '['}{_bound(lo)}, "
                    f"{_bound(hi)}{')' if self.hi_open else ']'}")
        if lo is not None:
            return f" {'>' if self.lo_open else '>='} {_bound(lo)}"
        if hi is not None:
            return f" {'<' if self.hi_open else '<='} {_bound(hi)}"
        return ""

    def problem(self, name: str, value: Any) -> str | None:
        """The refusal of `value` for field `name` (None: it is allowed)."""
        return None if self._fits(value) else refusal(name, value, self)

    def check(self, name: str, value: Any, error: type[Exception] = UsageError) -> Any:
        """`value` checked (a float kind returned as float), or `error(refusal)`."""
        if not self._fits(value):
            raise error(refusal(name, value, self))
        return float(value) if self.kind is float and value is not None else value

    def _fits(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        if self.kind is str:
            return isinstance(value, str) and (not self.choices or value in self.choices)
        if not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if self.kind is float:
            if isinstance(value, int) and abs(value) > 1e308:  # float() would overflow
                return False
            if not math.isfinite(value):  # NaN never
                return self.inf_ok and value == math.inf
        return self._within(value)

    def _within(self, value: float) -> bool:
        # a huge int compares exactly against a float bound
        lo, hi = self.lo, self.hi
        if lo is not None and (value <= lo if self.lo_open else value < lo):
            return False
        return not (hi is not None and (value >= hi if self.hi_open else value > hi))


def refusal(name: str, value: Any, allowed: Allowed) -> str:
    """`name = value: must be <what is allowed>`, the shape of every refusal."""
    return f"{name} = {shown(value, allowed.kind)}: must be {allowed.describe()}"


def shown(value: Any, kind: type = object) -> str:
    """The value as a message quotes it; a whole float as the user likely typed it (`-5`)."""
    if kind is float and isinstance(value, float) and value.is_integer() \
            and abs(value) < 1e16:
        return str(int(value))
    return preview(value)
