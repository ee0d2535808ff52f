"""`UsageError`: a user's mistake, told in one line.

A bad flag, a bad value in a file the user gave, an output path that cannot be written:
library code raises `UsageError` (or a subclass: `ConfigError`, `WorkloadError`) with a
message naming what was wrong and what is allowed, and `stepserve`'s `main()` prints it
as `error: <message>` on stderr and exits 2. Nothing else is caught there: any other
exception is a bug and keeps its traceback. Each command's handler is wrapped the same
way (`reports_usage_errors`), so it answers alike when a test or another module calls it
without `main()`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2


class UsageError(ValueError):
    """A user's mistake: printed as `error: <message>` (one line), exit status 2.

    A ValueError, so code that already catches ValueError around user input keeps
    working."""


def one_line(message: object) -> str:
    """The message with its lines joined, so it prints as one line (YAML and JSON
    parsers put their context on lines of their own)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report_error(error: BaseException | str) -> int:
    """Print `error: <message>` on one line to stderr; returns the exit status, 2."""
    print(f"error: {one_line(error)}", file=sys.stderr)
    return EXIT_USAGE


Command = Callable[[Any], int]  # a subcommand's handler: parsed flags -> exit status


def reports_usage_errors(command: Command) -> Command:
    """Wrap a subcommand's handler: a UsageError becomes `error: ...` and exit 2."""

    @functools.wraps(command)
    def run(args: Any) -> int:
        try:
            return command(args)
        except UsageError as e:
            return report_error(e)

    return run
