"""`UsageError`: a user's mistake (or a subclass: `ConfigError`, `WorkloadError`), which
each command prints as one line, `error: <message>`, and exits 2. Nothing else is caught
there: any other exception is a bug and keeps its traceback."""

from __future__ import annotations

import sys

EXIT_USAGE = 2


class UsageError(ValueError):
    """A ValueError, so code that catches ValueError around user input keeps working."""


def one_line(message: object) -> str:
    """The message's lines joined (YAML and JSON parsers put context on lines of their own)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report_error(error: BaseException | str) -> int:
    print(f"error: {one_line(error)}", file=sys.stderr)
    return EXIT_USAGE
