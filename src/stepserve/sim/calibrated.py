"""The calibrated cost model: a step's time as a sum of terms (TERMS: a fixed step cost;
per sequence; per token, and per token past `knee_tokens`; per KV token a decode reads;
per causal attention pair of a prefill chunk; per block swapped; per request joining the
batch; per prefill chunk), each a measured cost per unit fitted to the real engine's
step times (`stepserve profile`) by non-negative least squares on relative error, so
each stays a cost, never a credit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from stepserve.config.limits import MAX_BATCHED_TOKENS, MAX_KV_BYTES, MAX_KV_BYTES_PER_TOKEN
from stepserve.config.validate import Allowed
from stepserve.core.output import SchedulerOutput
from stepserve.sim.cost import CostModel, causal_pairs, computed_tokens, joining

SCHEMA = "stepserve.cost/1"
# a server's profile (`profile --target`, profile/target_profile.py): its `cost` part is
# a cost file, so every --cost FILE takes the profile itself
TARGET_PROFILE_SCHEMA = "stepserve.target-profile/1"
_NOT_ONE = (1).__ne__
# each term: how it is shown (its coefficient times the scale, in the unit)
SHOWN = {"step": (1e3, "ms per step"), "seq": (1e6, "us per sequence"),
         "token": (1e6, "us per token"), "token_hi": (1e6, "us per token past the knee"),
         "kv_read": (1e9, "ns per KV token read"), "attn": (1e9, "ns per attention pair"),
         "swap": (1e6, "us per block copied"), "join": (1e6, "us per request joining the batch"),
         "chunk": (1e6, "us per prefill chunk")}
TERMS = tuple(SHOWN)
# the scheduling overhead's terms (sim/cost.py), named in describe()
SCHEDULING_TERMS = ("seq", "join")


def step_terms(out: SchedulerOutput, knee_tokens: int) -> tuple[float, ...]:
    """The work of one step, in the order of TERMS: a decode reads start + 1 keys, a
    prefill chunk attends causally (`causal_pairs`), a chunk at token 0 joins."""
    counts = out.num_scheduled_tokens
    starts = computed_tokens(out)
    tokens = sum(counts)
    if counts.count(1) == out.num_decode_tokens:
        # as many 1-token entries as decodes: those are the decodes (no per-request call)
        prefill = list(map(_NOT_ONE, counts))
    else:  # built by hand: ask each request
        prefill = [not req.is_decoding for req in out.requests]
    pre_n, pre_start = list(compress(counts, prefill)), list(compress(starts, prefill))
    kv_read = sum(starts) - sum(pre_start) + len(counts) - len(pre_n)
    attn = float(causal_pairs(pre_n, pre_start))
    over = tokens - knee_tokens if tokens > knee_tokens else 0
    swaps = len(out.swap_in) + len(out.swap_out)
    return (1.0, float(len(out.requests)), float(tokens), float(over), float(kv_read), attn,
            float(swaps), float(joining(starts)), float(len(pre_n)))


# What a cost file may say. A real engine's terms are microseconds to milliseconds per
# unit; a minute per unit is far past any, and keeps every step's time (at most
# MAX_BATCHED_TOKENS tokens and MAX_BLOCKS blocks of counts) and so the virtual clock finite.
MAX_COEFFICIENT_S = 60.0
COEFFICIENT = Allowed(0, MAX_COEFFICIENT_S, kind=float)
KNEE_TOKENS = Allowed(0, MAX_BATCHED_TOKENS)
# what the simulator reads of where a cost was measured: the KV pool it sizes a run's
# cache from, and the names its messages quote
META = {"kv_cache_bytes": Allowed(1, MAX_KV_BYTES, optional=True),
        "kv_bytes_per_token": Allowed(1, MAX_KV_BYTES_PER_TOKEN, optional=True),
        **dict.fromkeys(("host", "hardware", "model", "date"),
                        Allowed(kind=str, optional=True))}


@dataclass(frozen=True)
class CalibratedCost(CostModel):
    coefficients: dict[str, float]  # seconds per unit of each term
    knee_tokens: int = 64
    meta: dict[str, Any] = field(default_factory=dict)  # where and how it was measured
    name = "calibrated"

    def __post_init__(self) -> None:
        unknown = set(self.coefficients) - set(TERMS)
        if unknown:
            raise ValueError(f"unknown cost terms {sorted(unknown)}; known: {', '.join(TERMS)}")
        object.__setattr__(self, "_c", tuple(self.coefficients.get(t, 0.0) for t in TERMS))

    def step_time(self, out: SchedulerOutput) -> float:
        return self._time(step_terms(out, self.knee_tokens))

    def decode_step_time(self, batch: int, computed: int) -> float:
        # step_terms of `batch` decodes
        over = batch - self.knee_tokens if batch > self.knee_tokens else 0
        return self._time((1.0, float(batch), float(batch), float(over),
                           float(computed + batch), 0.0, 0.0, 0.0, 0.0))

    def _time(self, x: tuple[float, ...]) -> float:
        c = self._c  # type: ignore[attr-defined]
        return (c[0] + c[1] * x[1] + c[2] * x[2] + c[3] * x[3] + c[4] * x[4] + c[5] * x[5]
                + c[6] * x[6] + c[7] * x[7] + c[8] * x[8])

    def describe(self) -> str:
        where = self.meta.get("model", "?"), self.meta.get("hardware", "?")
        overhead = ", ".join(f"{self.coefficients.get(t, 0.0) * SHOWN[t][0]:.3g} "
                             f"{SHOWN[t][1]}" for t in SCHEDULING_TERMS)
        return (f"calibrated on {where[0]} / {where[1]} ({self.meta.get('date', 'undated')}); "
                f"scheduling overhead {overhead}")

    def explain(self) -> list[str]:
        """One line per term: its coefficient in a readable unit."""
        return [f"{t:<9} {self.coefficients.get(t, 0.0) * scale:>10.4g} {unit}"
                for t, (scale, unit) in SHOWN.items()]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "knee_tokens": self.knee_tokens,
                "coefficients": dict(self.coefficients), **self.meta}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibratedCost:
        """A cost file's JSON, or a target profile's (its `cost` part)."""
        if data.get("schema") == TARGET_PROFILE_SCHEMA:
            data = data.get("cost")
            if not isinstance(data, dict) or data.get("schema") != SCHEMA:
                raise ValueError(f"target profile: `cost` must be a {SCHEMA!r} cost model")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a stepserve cost file (schema {data.get('schema')!r}, "
                             f"expected {SCHEMA!r})")
        coefficients = data.get("coefficients")
        if not isinstance(coefficients, dict):
            raise ValueError("cost file: `coefficients` must map terms to seconds per unit")
        checked = {k: COEFFICIENT.check(f"cost file: coefficients.{k}", v, ValueError)
                   for k, v in coefficients.items()}
        knee = KNEE_TOKENS.check("cost file: knee_tokens", data.get("knee_tokens", 64),
                                 ValueError)
        meta = {k: v for k, v in data.items()
                if k not in ("schema", "knee_tokens", "coefficients")}
        for key, allowed in META.items():
            allowed.check(f"cost file: {key}", meta.get(key), ValueError)
        return cls(checked, knee, meta)


# ---- fitting ----

def fit(rows: Sequence[Sequence[float]], seconds: Sequence[float]) -> dict[str, float]:
    """Non-negative least squares of `seconds` on the term rows, on relative error."""
    if len(rows) != len(seconds) or not rows:
        raise ValueError("fit needs as many measured times as term rows, at least one")
    weighted = [[x / t for x in row] for row, t in zip(rows, seconds)]
    coef = nnls(weighted, [1.0] * len(rows))
    return {t: c for t, c in zip(TERMS, coef) if c > 0.0}


def nnls(a: Sequence[Sequence[float]], b: Sequence[float], iterations: int = 200
         ) -> list[float]:
    """min ||A x - b|| subject to x >= 0 (Lawson-Hanson active set), for a few columns."""
    cols = len(a[0])
    scale = [math.sqrt(sum(row[j] ** 2 for row in a)) or 1.0 for j in range(cols)]
    a = [[row[j] / scale[j] for j in range(cols)] for row in a]  # unit columns: stable
    x = [0.0] * cols
    passive: list[int] = []
    for _ in range(iterations):
        grad = _gradient(a, b, x)
        free = [j for j in range(cols) if j not in passive and grad[j] > 1e-12]
        if not free:
            break
        passive.append(max(free, key=lambda j: grad[j]))
        while True:
            z = [0.0] * cols
            for j, v in zip(passive, _lstsq(a, b, passive)):
                z[j] = v
            if all(z[j] > 0 for j in passive):
                x = z
                break
            alpha = min(x[j] / (x[j] - z[j]) for j in passive if z[j] <= 0)
            x = [x[j] + alpha * (z[j] - x[j]) for j in range(cols)]
            passive = [j for j in passive if x[j] > 1e-15]
    return [x[j] / scale[j] for j in range(cols)]


def _gradient(a, b, x) -> list[float]:
    """A^T (b - A x)."""
    resid = [bi - sum(r * xi for r, xi in zip(row, x)) for row, bi in zip(a, b)]
    return [sum(row[j] * r for row, r in zip(a, resid)) for j in range(len(x))]


def _lstsq(a, b, cols: list[int]) -> list[float]:
    """Least squares on the chosen columns (normal equations, Gaussian elimination)."""
    m = [[sum(row[i] * row[j] for row in a) for j in cols] for i in cols]
    v = [sum(row[i] * bi for row, bi in zip(a, b)) for i in cols]
    n = len(cols)
    for k in range(n):
        p = max(range(k, n), key=lambda r: abs(m[r][k]))
        m[k], m[p], v[k], v[p] = m[p], m[k], v[p], v[k]
        if abs(m[k][k]) < 1e-18:
            continue
        for r in range(k + 1, n):
            f = m[r][k] / m[k][k]
            m[r] = [mr - f * mk for mr, mk in zip(m[r], m[k])]
            v[r] -= f * v[k]
    out = [0.0] * n
    for k in reversed(range(n)):
        if abs(m[k][k]) >= 1e-18:
            out[k] = (v[k] - sum(m[k][j] * out[j] for j in range(k + 1, n))) / m[k][k]
    return out


def relative_errors(model: CalibratedCost, rows: Sequence[Sequence[float]],
                    seconds: Sequence[float]) -> list[float]:
    """|predicted - measured| / measured for each row."""
    c = [model.coefficients.get(t, 0.0) for t in TERMS]
    return [abs(sum(ci * xi for ci, xi in zip(c, row)) - t) / t for row, t in zip(rows, seconds)]
