"""Token-length distributions for prompts and outputs (their YAML shapes, read by
`parse_length` and written by `to_dict`: docs/guide.md, "Workloads"). `sample(rng)`
returns an integer >= 1 drawn only from the caller's `rng`, so a workload is reproducible
from its seed.
"""

from __future__ import annotations

import abc
import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepserve.config.limits import MAX_LEN, MAX_WEIGHT
from stepserve.config.user_files import preview, read_text
from stepserve.workload.errors import (
    WorkloadError,
    check_int,
    check_keys,
    check_positive,
    located,
    one_key,
    read_user_file,
    resolved,
)

# z of the 99th percentile of the standard normal: P99 = exp(mu + Z99 * sigma).
Z99 = 2.3263478740408408


class LengthDist(abc.ABC):
    @abc.abstractmethod
    def sample(self, rng: random.Random) -> int: ...

    @abc.abstractmethod
    def mean(self) -> float: ...

    @abc.abstractmethod
    def moments(self, cap: int) -> tuple[float, float]:
        """E[min(X, cap)] and E[min(X, cap)^2] of a draw X: what a size guard needs where
        a cost grows with the square of a length (a session's history in its turns)."""

    @abc.abstractmethod
    def describe(self) -> str: ...

    @abc.abstractmethod
    def to_dict(self) -> Any: ...


@dataclass(frozen=True)
class Fixed(LengthDist):
    n: int

    def __post_init__(self) -> None:
        check_int("fixed", self.n, lo=1, hi=MAX_LEN)

    def sample(self, rng: random.Random) -> int:
        return self.n

    def mean(self) -> float:
        return float(self.n)

    def moments(self, cap: int) -> tuple[float, float]:
        m = float(min(self.n, cap))
        return m, m * m

    def describe(self) -> str:
        return f"fixed {self.n}"

    def to_dict(self) -> Any:
        return {"fixed": self.n}


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Integers lo..hi, both included."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        check_int("uniform.lo", self.lo, lo=1, hi=MAX_LEN)
        check_int("uniform.hi", self.hi, lo=1, hi=MAX_LEN)
        if self.hi < self.lo:
            raise WorkloadError(f"uniform.hi = {self.hi}: must be >= uniform.lo = {self.lo}")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)

    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def moments(self, cap: int) -> tuple[float, float]:
        n = self.hi - self.lo + 1
        top = min(self.hi, cap)  # lo..top are drawn as themselves, the rest count as cap
        if top < self.lo:
            return float(cap), float(cap) * cap
        above = self.hi - top
        first = _sum_to(top) - _sum_to(self.lo - 1) + above * cap
        second = _squares_to(top) - _squares_to(self.lo - 1) + above * cap * cap
        return first / n, second / n

    def describe(self) -> str:
        return f"uniform {self.lo}..{self.hi}"

    def to_dict(self) -> Any:
        return {"uniform": [self.lo, self.hi]}


def _sum_to(k: int) -> int:
    return k * (k + 1) // 2


def _squares_to(k: int) -> int:
    return k * (k + 1) * (2 * k + 1) // 6


def cumulative_shares(weights: Sequence[float]) -> tuple[float, ...]:
    """The normalised running sums of `weights`, for a weighted pick by bisecting
    rng.random(); the last is exactly 1.0, so round-off never lets a draw fall off the end."""
    total = math.fsum(weights)
    cumulative = [math.fsum(weights[: i + 1]) / total for i in range(len(weights))]
    if cumulative:
        cumulative[-1] = 1.0
    return tuple(cumulative)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """Given by its median and 99th percentile, the two numbers people quote for lengths
    (the night-report incident: output P50 20, P99 2,000). Samples are rounded to integers
    and clipped to [1, max] (max: at most limits.MAX_LEN, which is also the default)."""

    p50: float
    p99: float
    max: int | None = None

    def __post_init__(self) -> None:
        check_positive("lognormal.p50", self.p50)
        check_positive("lognormal.p99", self.p99)
        if self.p50 < 1:
            raise WorkloadError(f"lognormal.p50 = {preview(self.p50)}: must be >= 1 "
                                "(a token count)")
        if self.p99 > MAX_LEN:
            raise WorkloadError(f"lognormal.p99 = {preview(self.p99)}: must be <= {MAX_LEN} tokens")
        if self.p99 < self.p50:
            raise WorkloadError(f"lognormal.p99 = {preview(self.p99)}: must be >= "
                                f"lognormal.p50 = {preview(self.p50)}")
        if self.max is not None:
            check_int("lognormal.max", self.max, lo=1, hi=MAX_LEN)
            if self.max < self.p50:
                raise WorkloadError(f"lognormal.max = {preview(self.max)}: must be >= "
                                    f"lognormal.p50 = {preview(self.p50)}, or the median "
                                    "would be clipped away")

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return (math.log(self.p99) - math.log(self.p50)) / Z99

    def sample(self, rng: random.Random) -> int:
        # clipped before rounding: a far-tail draw may be too large for round()
        value = min(rng.lognormvariate(self.mu, self.sigma), MAX_LEN)
        value = max(1, round(value))
        return value if self.max is None else min(value, self.max)

    def mean(self) -> float:
        """E[min(X, max)] of the continuous distribution (rounding and the floor at 1
        move it by under one token)."""
        mu, sigma = self.mu, self.sigma
        unclipped = math.exp(mu + sigma * sigma / 2)
        if self.max is None:
            return unclipped
        if sigma == 0.0:
            return min(self.p50, self.max)
        z = (math.log(self.max) - mu) / sigma
        return unclipped * _normal_cdf(z - sigma) + self.max * (1.0 - _normal_cdf(z))

    def moments(self, cap: int) -> tuple[float, float]:
        """Of the continuous distribution clipped where sampling clips it (max, MAX_LEN)
        and at `cap`: E[min(X, c)^k] = e^(k mu + k^2 sigma^2 / 2) Phi(z - k sigma) +
        c^k (1 - Phi(z)), z = (ln c - mu) / sigma."""
        c = min(cap, MAX_LEN, self.max if self.max is not None else MAX_LEN)
        mu, sigma = self.mu, self.sigma
        if sigma == 0.0:
            m = min(self.p50, c)
            return m, m * m
        z = (math.log(c) - mu) / sigma
        tail = 1.0 - _normal_cdf(z)
        return tuple(math.exp(k * mu + k * k * sigma * sigma / 2) * _normal_cdf(z - k * sigma)
                     + c ** k * tail for k in (1, 2))  # type: ignore[return-value]

    def describe(self) -> str:
        clip = f" max={self.max}" if self.max is not None else ""
        return f"lognormal p50={self.p50:g} p99={self.p99:g}{clip} (mean {self.mean():.0f})"

    def to_dict(self) -> Any:
        body: dict[str, Any] = {"p50": self.p50, "p99": self.p99}
        if self.max is not None:
            body["max"] = self.max
        return {"lognormal": body}


@dataclass(frozen=True)
class Mixture(LengthDist):
    """Pick a component by weight (relative: they need not sum to 1), then sample it."""

    parts: tuple[tuple[float, LengthDist], ...]
    _cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = self.parts
        if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or not parts:
            raise WorkloadError(f"mixture = {preview(parts)}: must list at least one component "
                                "(weight, length distribution)")
        for i, part in enumerate(parts):
            if not isinstance(part, Sequence) or len(part) != 2 \
                    or not isinstance(part[1], LengthDist):
                raise WorkloadError(
                    f"mixture[{i}] = {preview(part)}: must be (weight, length distribution)")
            check_positive(f"mixture[{i}].weight", part[0], hi=MAX_WEIGHT)
        # The weights are kept as given (so to_dict round-trips exactly); sampling uses
        # their normalised running sums.
        parts = tuple((float(w), dist) for w, dist in parts)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "_cumulative", cumulative_shares([w for w, _ in parts]))

    @property
    def weights(self) -> tuple[float, ...]:
        """The components' weights, normalised to sum to 1."""
        total = math.fsum(w for w, _ in self.parts)
        return tuple(w / total for w, _ in self.parts)

    def sample(self, rng: random.Random) -> int:
        index = bisect.bisect_right(self._cumulative, rng.random())
        return self.parts[index][1].sample(rng)

    def mean(self) -> float:
        return sum(w * dist.mean() for w, (_, dist) in zip(self.weights, self.parts, strict=True))

    def moments(self, cap: int) -> tuple[float, float]:
        each = [(w, dist.moments(cap)) for w, (_, dist) in zip(self.weights, self.parts,
                                                               strict=True)]
        return sum(w * m[0] for w, m in each), sum(w * m[1] for w, m in each)

    def describe(self) -> str:
        inner = ", ".join(f"{w:.1%} {dist.describe()}"
                          for w, (_, dist) in zip(self.weights, self.parts, strict=True))
        return f"mixture({inner})"

    def to_dict(self) -> Any:
        return {"mixture": [{"weight": w, **dist.to_dict()} for w, dist in self.parts]}


@dataclass(frozen=True)
class Empirical(LengthDist):
    """Sample uniformly from observed lengths (e.g. output lengths from production logs).
    `source` remembers the file they came from, so `to_dict` writes the path back."""

    values: tuple[int, ...]
    source: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.values, (str, bytes)) or not isinstance(self.values, Sequence) \
                or not self.values:
            raise WorkloadError(f"empirical = {preview(self.values)}: must be a non-empty list of "
                                "integers >= 1")
        for i, v in enumerate(self.values):
            check_int(f"empirical[{i}]", v, lo=1, hi=MAX_LEN)
        object.__setattr__(self, "values", tuple(self.values))

    def sample(self, rng: random.Random) -> int:
        return rng.choice(self.values)

    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def moments(self, cap: int) -> tuple[float, float]:
        clipped = [min(v, cap) for v in self.values]
        return sum(clipped) / len(clipped), sum(v * v for v in clipped) / len(clipped)

    def describe(self) -> str:
        where = f" from {self.source}" if self.source else ""
        return f"empirical n={len(self.values)}{where} (mean {self.mean():.0f})"

    def to_dict(self) -> Any:
        return {"empirical": {"file": self.source} if self.source else list(self.values)}


# the lower-case names the docs and scenarios use
fixed, uniform, lognormal, mixture = Fixed, Uniform, LogNormal, Mixture


def empirical(values: Sequence[int] | str | Path) -> Empirical:
    """From a list of lengths, or from a file of integers when given a path: one a line,
    blank lines and lines starting with # skipped."""
    if not isinstance(values, (str, Path)):
        return Empirical(tuple(values))
    p = Path(values)
    text = read_user_file(read_text, p, "empirical.file")
    lengths: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            value = int(line)
        except ValueError:
            raise WorkloadError(f"empirical.file {str(p)!r} line {number} = "
                                f"{preview(line)}: must be one integer >= 1") from None
        check_int(f"empirical.file {str(p)!r} line {number}", value, lo=1, hi=MAX_LEN)
        lengths.append(value)
    if not lengths:
        raise WorkloadError(f"empirical.file = {str(p)!r}: holds no lengths")
    return Empirical(tuple(lengths), source=str(p))


LENGTH_KINDS = ("fixed", "uniform", "lognormal", "mixture", "empirical")


def parse_length(data: Any, where: str = "length", base_dir: Path | None = None) -> LengthDist:
    """Build a distribution from its YAML shape. `where` (e.g. `classes[1].output`) prefixes
    error messages; `base_dir` resolves relative empirical file paths."""
    with located(where):
        if isinstance(data, int) and not isinstance(data, bool):
            return Fixed(data)  # shorthand: `output: 200`
        kind, body = one_key("", data, LENGTH_KINDS)
        if kind == "fixed":
            return Fixed(body)
        if kind == "uniform":
            if not isinstance(body, Sequence) or isinstance(body, str) or len(body) != 2:
                raise WorkloadError(f"uniform = {preview(body)}: must be [lo, hi], integers >= 1")
            return Uniform(body[0], body[1])
        if kind == "lognormal":
            if not isinstance(body, Mapping):
                raise WorkloadError(f"lognormal = {preview(body)}: must be a mapping "
                                    "{p50, p99, max}")
            check_keys("lognormal", body, ("p50", "p99", "max"), required=("p50", "p99"))
            return LogNormal(body["p50"], body["p99"], body.get("max"))
        if kind == "mixture":
            if not isinstance(body, Sequence) or isinstance(body, str) or not body:
                raise WorkloadError(f"mixture = {preview(body)}: must be a non-empty list of "
                                    "{weight: w, <distribution>}")
            parts = []
            for i, entry in enumerate(body):
                if not isinstance(entry, Mapping) or "weight" not in entry:
                    raise WorkloadError(f"mixture[{i}] = {preview(entry)}: must be a mapping with "
                                        f"'weight' and one of: {', '.join(LENGTH_KINDS)}")
                rest = {k: v for k, v in entry.items() if k != "weight"}
                parts.append((entry["weight"], parse_length(rest, f"mixture[{i}]", base_dir)))
            return Mixture(tuple(parts))
        if isinstance(body, Mapping):
            check_keys("empirical", body, ("file",), required=("file",))
            body = body["file"]
        if isinstance(body, str):
            return empirical(resolved(body, base_dir))
        if not isinstance(body, Sequence):
            raise WorkloadError(f"empirical = {preview(body)}: must be a list of integers >= 1 or "
                                "{file: path}")
        return Empirical(body)  # the constructor checks and freezes it
