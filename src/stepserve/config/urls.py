"""The one check of a server URL a user gives (`bench --target`, `sweep --target`,
`doctor --url`): parsed the way the HTTP client will parse it, so a typo such as
`http://[::1` or `http://host:99999` is one line naming the flag, not a traceback."""

from __future__ import annotations

import httpx

from stepserve.config.errors import UsageError

EXAMPLE = "e.g. http://127.0.0.1:8000"


def check_http_url(flag: str, url: str) -> str:
    """`url` without its trailing slash; UsageError unless it is an http(s) URL with a
    host (and a port in 1..65535, when given)."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{flag} {url!r}: expected an http:// or https:// URL, {EXAMPLE}")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise UsageError(f"{flag} {url!r}: not a valid URL ({e}), {EXAMPLE}") from None
    if not parsed.host:
        raise UsageError(f"{flag} {url!r}: the URL has no host, {EXAMPLE}")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise UsageError(f"{flag} {url!r}: port {parsed.port} is not in 1..65535")
    return url.rstrip("/")
