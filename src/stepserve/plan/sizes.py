"""Byte sizes as people write them: "38GB", "192 KiB", "1.5GiB", "4096".

KB/MB/GB/TB are powers of 1000 and KiB/MiB/GiB/TiB powers of 1024 (SI and IEC); GPU
vendors quote memory in GB, model configs KV sizes in KiB. There are no one-letter units
("G", "K"): they would have to pick one of the two families silently (the engine's
settings read vLLM's `4G`: config/load.py's parse_size)."""

from __future__ import annotations

import re
from decimal import Decimal

from stepserve.config.user_files import preview

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

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in `text`. Fractions of a byte after scaling are dropped ("1.3GiB")."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {preview(text)} is negative; expected {ACCEPTED_FORMS}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {preview(text)} is not text; expected {ACCEPTED_FORMS}")
    match = _SIZE_RE.match(text)
    if match is None or match.group(2).lower() not in UNITS:
        raise ValueError(f"cannot read size {preview(text)}: expected {ACCEPTED_FORMS}")
    value, scale = Decimal(match.group(1)), UNITS[match.group(2).lower()]
    if scale == 1 and value != value.to_integral_value():
        raise ValueError(f"size {preview(text)} is not a whole number of bytes; expected "
                         f"{ACCEPTED_FORMS}")
    return int(value * scale)


def format_size(num_bytes: int) -> str:
    """The shortest exact spelling ("192 KiB", "38 GB"), else an approximate binary one.

    Exact spellings round-trip through `parse_size`; approximate ones carry a "~".
    """
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
