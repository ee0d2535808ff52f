"""Goodput SLOs, as `vllm bench serve --goodput`: `ttft:500 tpot:50 e2el:2000`, each
value in milliseconds. A request counts toward goodput only if it meets every one."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

GOODPUT_KEYS = ("ttft", "tpot", "e2el")


class GoodputError(ValueError):
    """A goodput string that does not parse; the message names the token."""


@dataclass(frozen=True)
class GoodputSLO:
    """Per-request latency limits for goodput, in seconds; None: not constrained. (A sweep's
    `--slo` is another thing: a limit on one metric of a run's summary, sweep/spec.py.)"""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2el_s is None

    def met(self, ttft_s: float | None, tpot_s: float | None, e2el_s: float | None) -> bool:
        """Every given limit is met. A TPOT limit is met by a one-token request (TPOT is
        undefined there, as vLLM treats it: 0)."""
        checks = ((self.ttft_s, ttft_s), (self.tpot_s, tpot_s if tpot_s is not None else 0.0),
                  (self.e2el_s, e2el_s))
        return all(limit is None or (value is not None and value <= limit)
                   for limit, value in checks)

    def describe(self) -> str:
        parts = [f"{k}<={v * 1000:g}ms" for k, v in
                 (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2el", self.e2el_s))
                 if v is not None]
        return " ".join(parts) or "none"


def parse_goodput(tokens: str | Iterable[str] | None) -> GoodputSLO:
    """`"ttft:500 tpot:50"` or `["ttft:500", "tpot:50"]` (ms) -> GoodputSLO (seconds)."""
    if tokens is None:
        return GoodputSLO()
    if isinstance(tokens, str):
        tokens = [tokens]
    values: dict[str, float] = {}
    allowed = ", ".join(GOODPUT_KEYS)
    for token in (t for chunk in tokens for t in chunk.replace(",", " ").split()):
        key, sep, raw = token.partition(":")
        key = key.strip().lower()
        if not sep:
            raise GoodputError(f"--goodput {token!r}: expected KEY:MILLISECONDS (keys: {allowed})")
        if key not in GOODPUT_KEYS:
            raise GoodputError(f"--goodput {token!r}: unknown key {key!r} (keys: {allowed})")
        if key in values:
            raise GoodputError(f"--goodput {token!r}: {key} given twice")
        try:
            ms = float(raw)
        except ValueError:
            raise GoodputError(f"--goodput {token!r}: {raw!r} is not a number of milliseconds "
                           f"(keys: {allowed})") from None
        if not math.isfinite(ms) or ms <= 0:
            raise GoodputError(f"--goodput {token!r}: the limit must be a positive number of "
                           "milliseconds")
        values[key] = ms / 1000.0
    return GoodputSLO(values.get("ttft"), values.get("tpot"), values.get("e2el"))
