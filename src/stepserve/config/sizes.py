"""Byte sizes as people write them: "38GB", "192 KiB", "1.5GiB", "4096"; KB..TB are
powers of 1000, KiB..TiB of 1024, in any case. A one-letter unit is vLLM's (4G and 4Gi are
4 GiB, 4g is 4e9), read only where vLLM's spellings are (`one_letter`: engine settings);
elsewhere it would pick one of the two families silently."""

from __future__ import annotations

import re
from decimal import Decimal

from stepserve.config.validate import preview

# the units as format_size spells them, in its order of preference (largest first)
_DISPLAY = [(prefix + unit, base**power)
            for power, prefix in ((4, "T"), (3, "G"), (2, "M"), (1, "K"))
            for unit, base in (("iB", 1024), ("B", 1000))]
DECIMAL_UNITS = {name.lower(): scale for name, scale in _DISPLAY if "i" not in name}
BINARY_UNITS = {name.lower(): scale for name, scale in _DISPLAY if "i" in name}
UNITS: dict[str, int] = {"": 1, "b": 1, **DECIMAL_UNITS, **BINARY_UNITS}

ACCEPTED_FORMS = (
    "a whole number of bytes (4096, 4096B) or a number with a unit: "
    "KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
    "e.g. 38GB, 192KiB, 1.5GiB"
)
ONE_LETTER_FORMS = ACCEPTED_FORMS + ", or as vLLM: 4G or 4Gi (binary), 4g (decimal)"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, one_letter: bool = False) -> int:
    """Bytes in `text`. Fractions of a byte after scaling are dropped ("1.3GiB")."""
    forms = ONE_LETTER_FORMS if one_letter else ACCEPTED_FORMS
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {preview(text)} is negative; expected {forms}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {preview(text)} is not text; expected {forms}")
    match = _SIZE_RE.match(text)
    scale = _scale(match.group(2), one_letter) if match else None
    if scale is None:
        raise ValueError(f"cannot read size {preview(text)}: expected {forms}")
    value = Decimal(match.group(1))
    if scale == 1 and value != value.to_integral_value():
        raise ValueError(f"size {preview(text)} is not a whole number of bytes; expected "
                         f"{forms}")
    return int(value * scale)


def _scale(unit: str, one_letter: bool) -> int | None:
    if unit.lower() in UNITS:
        return UNITS[unit.lower()]
    if one_letter and unit[:1].lower() in ("k", "m", "g", "t") and unit[1:] in ("", "i"):
        binary = unit[1:] == "i" or unit[0].isupper()
        return (1024 if binary else 1000) ** ("kmgt".index(unit[0].lower()) + 1)
    return None


def format_size(num_bytes: int) -> str:
    """The shortest exact spelling ("192 KiB", "38 GB", which parse_size reads back), else
    an approximate binary one ("~1.23 GiB")."""
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
        raise ValueError(f"format_size needs a non-negative integer, got {preview(num_bytes)}")
    for name, scale in _DISPLAY:
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale} {name}"
    # Exact multiples with a fraction, like 1.5 GiB, are still exact: try one decimal place.
    for name, scale in _DISPLAY:
        if num_bytes >= scale and (num_bytes * 10) % scale == 0:
            return f"{Decimal(num_bytes) / scale} {name}"
    for name, scale in _DISPLAY[::2]:  # binary units only
        if num_bytes >= scale:
            return f"~{num_bytes / scale:.2f} {name}"
    return f"{num_bytes} B"


_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtKMGT]?)\s*$")
COUNT_FORMS = ("a whole number, or as vLLM: with k, m, g, t (powers of 1000; 25.6k too) or "
               "K, M, G, T (powers of 1024, after a whole number), e.g. 32k, 32K")


def parse_count(text: str | int) -> int:
    """A count of tokens as vLLM's flags read one ("32k" 32,000, "25.6k" 25,600, "32K"
    32,768; a binary unit follows a whole number); a fraction left after scaling is
    refused, not dropped."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _COUNT_RE.match(text) if isinstance(text, str) else None
    if match is None or (match.group(2).isupper() and "." in match.group(1)):
        raise ValueError(f"cannot read {preview(text)} as a count: expected {COUNT_FORMS}")
    number, unit = Decimal(match.group(1)), match.group(2)
    scale = 1 if not unit else (1024 if unit.isupper() else 1000) ** ("kmgt".index(
        unit.lower()) + 1)
    value = number * scale
    if value != value.to_integral_value():
        raise ValueError(f"{preview(text)} is not a whole count; expected {COUNT_FORMS}")
    return int(value)
