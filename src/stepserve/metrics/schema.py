"""The version of the result files' layout (`schema_version`), written by every result
type's `to_json` (simulate, sweep, bench). A file without one was written before it was
recorded (version 0) and reads the same way; a newer one is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepserve.config.errors import UsageError

SCHEMA_KEY = "schema_version"
SCHEMA_VERSION = 1  # 1: schema_version added, itl_max_s in summaries


def check_schema(data: Mapping[str, Any], where: str) -> int:
    """The file's schema version (0 when absent); UsageError for one this code cannot
    read."""
    version = data.get(SCHEMA_KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UsageError(f"{where}: {SCHEMA_KEY} = {version!r}: expected a whole number")
    if version > SCHEMA_VERSION:
        raise UsageError(f"{where}: {SCHEMA_KEY} {version} is newer than this stepserve "
                         f"reads ({SCHEMA_VERSION}); upgrade stepserve to read it")
    return version
