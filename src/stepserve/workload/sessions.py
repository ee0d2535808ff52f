"""Multi-turn sessions: a class whose every arrival opens a conversation of `turns`
requests (the YAML shape: docs/guide.md, "Multi-turn sessions"). Turn k sends turn k-1's
prompt and answer again, then a new user message of `user_len` tokens, so it shares that
history with what the previous turn computed. The arrival process times only first turns;
a later turn is sent `think_time_s` after its predecessor ended, so its time is known only
when the run gets there (its spec carries the session's start as a lower bound). A turn
whose predecessor did not complete ends its session.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepserve.config.limits import MAX_LEN, MAX_NUM_REQUESTS
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.workload.errors import WorkloadError, check_keys, keyed, located, one_key
from stepserve.workload.lengths import LengthDist, parse_length

if TYPE_CHECKING:
    from stepserve.workload.trace import RequestSpec

MULTI_TURN_KEYS = ("turns", "think_time_s", "user_len")
# A conversation longer than this is a script, not a chat; the bound also keeps a class's
# expected history (quadratic in the turns) within what a workload may hold.
MAX_TURNS = 1_000
# A user away for more than a day has left the session.
MAX_THINK_S = 86_400.0
THINK_KINDS = ("fixed", "uniform", "exponential")
_SECONDS = Allowed(0, MAX_THINK_S, float)


@dataclass(frozen=True)
class ThinkTime:
    """Seconds between an answer's end and the next turn's send: `fixed` (lo), `uniform`
    on [lo, hi], or `exponential` of mean lo (capped at MAX_THINK_S)."""

    kind: str = "fixed"
    lo: float = 0.0
    hi: float = 0.0

    def __post_init__(self) -> None:
        Allowed(choices=THINK_KINDS, kind=str).check("think_time_s", self.kind, WorkloadError)
        object.__setattr__(self, "lo", _SECONDS.check(f"think_time_s.{self.kind}", self.lo,
                                                      WorkloadError))
        if self.kind == "uniform":
            hi = Allowed(self.lo, MAX_THINK_S, float).check("think_time_s.uniform[1]",
                                                            self.hi, WorkloadError)
            object.__setattr__(self, "hi", hi)

    def sample(self, rng: random.Random) -> float:
        if self.kind == "uniform":
            return rng.uniform(self.lo, self.hi)
        if self.kind == "exponential" and self.lo > 0:
            return min(rng.expovariate(1.0 / self.lo), MAX_THINK_S)
        return self.lo

    def mean(self) -> float:
        return (self.lo + self.hi) / 2 if self.kind == "uniform" else self.lo

    def describe(self) -> str:
        if self.kind == "uniform":
            return f"uniform {self.lo:g}-{self.hi:g} s"
        return f"{'exponential, mean ' if self.kind == 'exponential' else ''}{self.lo:g} s"

    def to_dict(self) -> Any:
        if self.kind == "fixed":
            return self.lo
        if self.kind == "uniform":
            return {"uniform": [self.lo, self.hi]}
        return {"exponential": {"mean": self.lo}}


def parse_think_time(data: Any) -> ThinkTime:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return ThinkTime("fixed", data)
    kind, body = one_key("think_time_s", data, THINK_KINDS)
    if kind == "fixed":
        return ThinkTime("fixed", body)
    if kind == "uniform":
        if not isinstance(body, Sequence) or isinstance(body, str) or len(body) != 2:
            raise WorkloadError(f"think_time_s.uniform = {preview(body)}: must be [lo, hi], "
                                f"seconds in [0, {MAX_THINK_S:g}]")
        return ThinkTime("uniform", body[0], body[1])
    if not isinstance(body, Mapping):
        raise WorkloadError(f"think_time_s.exponential = {preview(body)}: must be {{mean: s}}")
    check_keys("think_time_s.exponential", body, ("mean",), required=("mean",))
    return ThinkTime("exponential", body["mean"])


@dataclass(frozen=True)
class MultiTurn:
    """A class's sessions: how many turns, the think time between them, and the length
    of each later user message (None: the class's prompt length)."""

    turns: LengthDist
    think_time: ThinkTime = ThinkTime()
    user_len: LengthDist | None = None

    def __post_init__(self) -> None:
        for name in ("turns", "user_len"):
            value = getattr(self, name)
            if not isinstance(value, LengthDist) and (name == "turns" or value is not None):
                raise WorkloadError(f"{name} = {preview(value)}: must be a length distribution")
        if not isinstance(self.think_time, ThinkTime):
            raise WorkloadError(f"think_time_s = {preview(self.think_time)}: must be seconds")
        Allowed(1, MAX_TURNS, float).check("turns (mean)", self.turns.mean(), WorkloadError)

    def describe(self) -> str:
        return (f"sessions of {self.turns.describe()} turns, {self.think_time.describe()} "
                "between them" + (f", user messages {self.user_len.describe()}"
                                  if self.user_len is not None else ""))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turns": self.turns.to_dict(),
                               "think_time_s": self.think_time.to_dict()}
        if self.user_len is not None:
            out["user_len"] = self.user_len.to_dict()
        return out

    def mean_tokens(self, first_prompt: float, user: float, output: float) -> float:
        """Expected prompt + output tokens of a whole session of t turns: turn k's prompt
        holds the k exchanges before it, so a session is t (first_prompt + output) +
        (output + user) t (t - 1) / 2 tokens, and its mean needs E[t(t-1)], not the mean
        turn count squared (one session in a hundred of 1,000 turns weighs ~10,000 times
        the other 99). An upper estimate: a session whose prompt would pass MAX_LEN ends."""
        t, t2 = self.turns.moments(MAX_TURNS)
        return t * (first_prompt + output) + (output + user) * (t2 - t) / 2


def parse_multi_turn(data: Any, where: str, base_dir: Path | None) -> MultiTurn:
    keyed(where, data, MULTI_TURN_KEYS, required=("turns",))
    turns = parse_length(data["turns"], f"{where}.turns", base_dir)
    user = data.get("user_len")
    user_len = None if user is None else parse_length(user, f"{where}.user_len", base_dir)
    with located(where):
        return MultiTurn(turns, parse_think_time(data.get("think_time_s", 0)), user_len)


def check_session_count(num_sessions: int, multi_turn: MultiTurn | None) -> None:
    """The expected requests of `num_sessions` sessions within MAX_NUM_REQUESTS."""
    if multi_turn is None:
        return
    turns = multi_turn.turns.moments(MAX_TURNS)[0]
    expected = num_sessions * turns
    if expected > MAX_NUM_REQUESTS:
        raise WorkloadError(
            f"num_requests = {num_sessions}: sessions of {turns:g} turns "
            f"on average make about {expected:,.0f} requests; at most {MAX_NUM_REQUESTS:,} "
            "(lower num_requests or the turns)")


def later_turns(first: RequestSpec, make: Callable[[int, float, random.Random], RequestSpec],
                multi_turn: MultiTurn, rng: random.Random) -> list[RequestSpec]:
    """The turns after `first` (indexed from first.index + 1): each one's output and
    cap drawn by `make` (the class's own request), its prompt the history so far plus a
    new user message. A session whose next prompt would pass MAX_LEN ends before it."""
    out: list[RequestSpec] = []
    prev = first
    for turn in range(1, min(multi_turn.turns.sample(rng), MAX_TURNS)):
        think = multi_turn.think_time.sample(rng)
        own: RequestSpec = make(first.index + turn, first.arrival_s, rng)
        user = multi_turn.user_len.sample(rng) if multi_turn.user_len is not None \
            else own.prompt_len - own.prefix_len
        history = prev.prompt_len + prev.output_len
        if history + user > MAX_LEN:
            break
        prev = dataclasses.replace(own, prompt_len=history + user, prefix=None, prefix_len=0,
                                   session=first.index, turn=turn, think_time_s=think,
                                   history_len=history)
        out.append(prev)
    return out


def next_turns(specs: Sequence[RequestSpec]) -> dict[int, int]:
    """Each turn's position in `specs` -> its session's next turn's position."""
    last: dict[int, int] = {}  # a session -> the position of its latest turn so far
    out: dict[int, int] = {}
    for k, spec in enumerate(specs):
        if spec.session is None:
            continue
        if spec.turn > 0 and spec.session in last:
            out[last[spec.session]] = k
        last[spec.session] = k
    return out


def session_starts(specs: Sequence[RequestSpec]) -> list[int]:
    """The positions of the requests the arrival process times (first turns and
    requests outside sessions), in order."""
    return [k for k, s in enumerate(specs) if s.turn == 0]
