"""The raw figures of `profile --target`: every request as the client saw it and what each
/metrics scrape said, grouped by probe. They are the profile's evidence: inference
(infer.py) and the fit (target_fit.py) read only these, so a profile written once can be
re-fitted offline (`profile --refit FILE`), and a test can fit a recorded run.

Times are seconds on the probe run's monotonic clock. A probe's kind is one of KINDS:

* `floor`: one-token prompts, one output token, one at a time (the HTTP path's floor);
* `prompt`: a prompt-only request (`max_tokens` 1) of `prompt_len` tokens, alone;
* `burst`: `batch` such requests sent at once;
* `decode`: a rung of the decode ladder, `batch` requests of `output_len` tokens at once;
* `mixed`: `batch` decodes, then one prompt of `long_len` tokens sent into them (the
  last request);
* `repeat`: one prompt sent twice, one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

KINDS = ("floor", "prompt", "burst", "decode", "mixed", "repeat")
# bounds on what a profile file may hold (it is user input when re-fitted)
MAX_RUNS = 10_000
MAX_REQUESTS_PER_RUN = 4096
MAX_TOKENS_PER_REQUEST = 1 << 16


@dataclass(frozen=True)
class Timing:
    """One request as the client saw it: sent, each token's arrival (the first ends its
    TTFT), the stream's end; the counts from the usage chunk (None where none came)."""

    prompt_len: int
    max_tokens: int
    send_s: float
    token_s: tuple[float, ...]
    end_s: float
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.send_s if self.token_s else None

    @property
    def gaps_s(self) -> list[float]:
        """The inter-token gaps."""
        t = self.token_s
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(frozen=True)
class Scrape:
    """What one /metrics scrape said of the series the profile reads (None: not on the
    page). `iteration_buckets`: the iteration-token histogram's cumulative buckets."""

    t_s: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    steps: float | None = None
    iteration_tokens_sum: float | None = None
    iteration_tokens_count: float | None = None
    iteration_buckets: tuple[tuple[float, float], ...] = ()
    prefix_cache_hits: float | None = None


@dataclass(frozen=True)
class ProbeRun:
    """One probe step: its kind and shape, its requests (in the order sent), and the
    scrapes before, during and after it."""

    kind: str
    prompt_len: int = 0
    batch: int = 1
    output_len: int = 1
    long_len: int = 0
    requests: tuple[Timing, ...] = ()
    before: Scrape | None = None
    after: Scrape | None = None
    during: tuple[Scrape, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"probe kind {self.kind!r}: not one of {', '.join(KINDS)}")

    def delta(self, name: str) -> float | None:
        """A counter's increase over the run (a Scrape field), None where unknown."""
        a = None if self.before is None else getattr(self.before, name)
        b = None if self.after is None else getattr(self.after, name)
        return None if a is None or b is None or b < a else b - a


@dataclass(frozen=True)
class TargetInfo:
    """What the server says of itself: /v1/models (the model, its folder and context), the
    engine its /metrics prefix names (None: no /metrics), and the KV cache's and the
    scheduler's settings where an info gauge carries them."""

    url: str
    model: str
    root: str | None = None
    max_model_len: int | None = None
    engine: str | None = None
    prompt_form: str = "ids"  # "ids": token-id prompts; "text": decoded by a tokenizer
    cache_info: dict[str, str] | None = None
    scheduler_info: dict[str, str] | None = None


@dataclass(frozen=True)
class ProbeFigures:
    target: TargetInfo
    runs: tuple[ProbeRun, ...] = ()
    budget_s: float = 0.0
    notes: tuple[str, ...] = field(default=())  # what the probes saw fit to say

    def of(self, kind: str) -> list[ProbeRun]:
        return [r for r in self.runs if r.kind == kind]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ProbeFigures:
        """Read back to_json's output; ValueError naming the first bad field."""
        d = _mapping("probes", data)
        target = _build(TargetInfo, "probes.target", d.get("target"))
        runs = d.get("runs", [])
        if not isinstance(runs, list) or len(runs) > MAX_RUNS:
            raise ValueError(f"probes.runs: expected a list of at most {MAX_RUNS} runs")
        return cls(target, tuple(_run(f"probes.runs[{i}]", r) for i, r in enumerate(runs)),
                   _number("probes.budget_s", d.get("budget_s", 0.0)),
                   tuple(str(n) for n in _list("probes.notes", d.get("notes", []))))


def _run(where: str, data: Any) -> ProbeRun:
    d = _mapping(where, data)
    reqs = _list(f"{where}.requests", d.get("requests", []))
    if len(reqs) > MAX_REQUESTS_PER_RUN:
        raise ValueError(f"{where}.requests: more than {MAX_REQUESTS_PER_RUN}")
    def scrape(w: str, v: Any) -> Scrape | None:
        return None if v is None else _scrape(w, v)

    try:
        return ProbeRun(
            str(d.get("kind")), *(int(_number(f"{where}.{k}", d.get(k, dflt)))
                                  for k, dflt in (("prompt_len", 0), ("batch", 1),
                                                  ("output_len", 1), ("long_len", 0))),
            requests=tuple(_timing(f"{where}.requests[{i}]", r) for i, r in enumerate(reqs)),
            before=scrape(f"{where}.before", d.get("before")),
            after=scrape(f"{where}.after", d.get("after")),
            during=tuple(_scrape(f"{where}.during[{i}]", s)
                         for i, s in enumerate(_list(f"{where}.during", d.get("during", [])))))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _timing(where: str, data: Any) -> Timing:
    d = _mapping(where, data)
    tokens = _list(f"{where}.token_s", d.get("token_s", []))
    if len(tokens) > MAX_TOKENS_PER_REQUEST:
        raise ValueError(f"{where}.token_s: more than {MAX_TOKENS_PER_REQUEST} tokens")
    optional = {k: None if d.get(k) is None else int(_number(f"{where}.{k}", d[k]))
                for k in ("output_tokens", "prompt_tokens", "cached_tokens")}
    return Timing(int(_number(f"{where}.prompt_len", d.get("prompt_len"))),
                  int(_number(f"{where}.max_tokens", d.get("max_tokens"))),
                  _number(f"{where}.send_s", d.get("send_s")),
                  tuple(_number(f"{where}.token_s", t) for t in tokens),
                  _number(f"{where}.end_s", d.get("end_s")), **optional,
                  error=None if d.get("error") is None else str(d["error"]))


def _scrape(where: str, data: Any) -> Scrape:
    d = _mapping(where, data)
    values = {f.name: None if d.get(f.name) is None else _number(f"{where}.{f.name}",
                                                                  d[f.name])
              for f in fields(Scrape) if f.name not in ("t_s", "iteration_buckets")}
    buckets = tuple((_number(f"{where}.iteration_buckets", b[0]),
                     _number(f"{where}.iteration_buckets", b[1]))
                    for b in _list(f"{where}.iteration_buckets", d.get("iteration_buckets", []))
                    if isinstance(b, (list, tuple)) and len(b) == 2)
    return Scrape(_number(f"{where}.t_s", d.get("t_s")), **values, iteration_buckets=buckets)


def _build(cls: type, where: str, data: Any):
    d = _mapping(where, data)
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def _mapping(where: str, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    return data


def _list(where: str, data: Any) -> Sequence[Any]:
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
    return data


def _number(where: str, value: Any) -> float:
    """A finite number (JSON's inf and nan are refused), within +-1e12."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            -1e12 <= value <= 1e12):
        raise ValueError(f"{where} = {value!r}: expected a finite number")
    return float(value)
