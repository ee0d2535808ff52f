"""`UsageError`: a user's mistake, told in one line.

Library code raises it (or a subclass: `ConfigError`, `WorkloadError`) with a message
naming what was wrong and what is allowed; each command prints it as `error: <message>`
on stderr and exits 2. Nothing else is caught there: any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import sys

EXIT_USAGE = 2


class UsageError(ValueError):
    """A ValueError, so code that already catches ValueError around user input keeps
    working."""


def one_line(message: object) -> str:
    """The message with its lines joined, so it prints as one line (YAML and JSON
    parsers put their context on lines of their own)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report_error(error: BaseException | str) -> int:
    """Print `error: <message>` on one line to stderr; returns the exit status, 2."""
    print(f"error: {one_line(error)}", file=sys.stderr)
    return EXIT_USAGE
