"""What a workload is: request classes, an arrival process, a count and a seed; and what
it produces: a list of `RequestSpec`s (trace.py), the same list for the same seed.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from dataclasses import dataclass, field

from stepserve.config.limits import (
    MAX_LEN,
    MAX_NUM_REQUESTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_WEIGHT,
    MAX_WORKLOAD_TOKENS,
)
from stepserve.config.user_files import preview
from stepserve.config.validate import Allowed
from stepserve.workload.arrivals import ArrivalProcess, TraceReplay
from stepserve.workload.errors import WorkloadError, check_int, check_positive, check_str
from stepserve.workload.lengths import LENGTH_KINDS, LengthDist, cumulative_shares
from stepserve.workload.sessions import MultiTurn, check_session_count, later_turns
from stepserve.workload.shared_prefix import check_shared_prefixes, prefix_name
from stepserve.workload.trace import RequestSpec, check_priority_and_tenant

# How a class fills `length_estimate`, the output length an SRPT scheduler is told:
# none (it must fall back on max_tokens), exact (an oracle), class_mean (it knows the
# class's mean output, as a router that classifies requests would).
LENGTH_ESTIMATES = ("none", "exact", "class_mean")


@dataclass(frozen=True)
class RequestClass:
    """A kind of request (e.g. `summary`, `chat`) with its share of the traffic.

    `max_tokens`: the cap every request asks for, a longer sampled output cut to it (None:
    exactly its output length). `pairs`: (prompt, output) lengths sampled jointly (a
    dataset, sharegpt.py), `prompt` and `output` then their marginals and `dataset` the
    YAML form it came from.
    """

    name: str
    share: float
    prompt: LengthDist
    output: LengthDist
    max_tokens: int | None = None
    priority: int = 0
    tenant: str = "default"
    length_estimate: str = "none"
    pairs: tuple[tuple[int, int], ...] | None = None
    dataset: dict | None = None
    shared_prefixes: int = 0
    prefix_len: int = 0
    multi_turn: MultiTurn | None = None  # sessions.py: each arrival opens a conversation

    def __post_init__(self) -> None:
        check_str("name", self.name)
        if self.pairs is not None:
            if not self.pairs:
                raise WorkloadError("pairs = (): a dataset class needs at least one pair")
            for i, pair in enumerate(self.pairs):
                if len(pair) != 2:
                    raise WorkloadError(f"pairs[{i}] = {preview(pair)}: must be (prompt, output)")
                check_int(f"pairs[{i}].prompt", pair[0], lo=1, hi=MAX_LEN)
                check_int(f"pairs[{i}].output", pair[1], lo=1, hi=MAX_LEN)
        object.__setattr__(self, "share", check_positive("share", self.share, hi=MAX_WEIGHT))
        for name in ("prompt", "output"):
            if not isinstance(getattr(self, name), LengthDist):
                raise WorkloadError(f"{name} = {preview(getattr(self, name))}: must be a length "
                                    f"distribution ({', '.join(LENGTH_KINDS)})")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, lo=1, hi=MAX_LEN)
        check_priority_and_tenant(self.priority, self.tenant)
        Allowed(choices=LENGTH_ESTIMATES, kind=str).check("length_estimate", self.length_estimate,
                                                          WorkloadError)
        check_shared_prefixes(self.shared_prefixes, self.prefix_len)
        if self.multi_turn is not None and not isinstance(self.multi_turn, MultiTurn):
            raise WorkloadError(f"multi_turn = {preview(self.multi_turn)}: must be a MultiTurn")

    def mean_tokens(self) -> float:
        """Expected prompt + output tokens of one arrival: a request, or a whole session
        (outputs cut at max_tokens; each length at most MAX_LEN)."""
        output = min(self.output.mean(), MAX_LEN)
        if self.max_tokens is not None:
            output = min(output, self.max_tokens)
        prompt = min(self.prompt.mean() + self.prefix_len, MAX_LEN)
        if self.multi_turn is None:
            return prompt + output
        user = self.multi_turn.user_len or self.prompt
        return self.multi_turn.mean_tokens(prompt, min(user.mean(), MAX_LEN), output)

    def make_session(self, index: int, arrival_s: float,
                     rng: random.Random) -> list[RequestSpec]:
        """One arrival of this class: a request, or a session's turns (indexed from
        `index`, each drawn from `rng` after the one before)."""
        first = self.make(index, arrival_s, rng)
        if self.multi_turn is None:
            return [first]
        first = dataclasses.replace(first, session=index)
        return [first, *later_turns(first, self.make, self.multi_turn, rng)]

    def make(self, index: int, arrival_s: float, rng: random.Random) -> RequestSpec:
        """One request of this class: prompt first, then output, from `rng`."""
        if self.pairs is not None:
            prompt_len, output_len = self.pairs[rng.randrange(len(self.pairs))]
        else:
            prompt_len = self.prompt.sample(rng)
            output_len = self.output.sample(rng)
        max_tokens = output_len if self.max_tokens is None else self.max_tokens
        output_len = min(output_len, max_tokens)
        estimate = None
        if self.length_estimate == "exact":
            estimate = output_len
        elif self.length_estimate == "class_mean":
            # clip by the class cap only: clipping by max_tokens = output_len would leak
            # the true length into what is meant to be a class-level guess
            estimate = max(1, round(self.output.mean()))
            if self.max_tokens is not None:
                estimate = min(estimate, self.max_tokens)
        prefix = None  # prefix_len is 0 too
        if self.shared_prefixes:
            prefix = prefix_name(self.name, rng.randrange(self.shared_prefixes))
            prompt_len = min(prompt_len + self.prefix_len, MAX_LEN)
        return RequestSpec(index, arrival_s, prompt_len, output_len, max_tokens, self.priority,
                           self.tenant, self.name, estimate, prefix, self.prefix_len)


@dataclass(frozen=True)
class Workload:
    """Classes x arrivals x count x seed. `generate()` is a pure function of these."""

    name: str
    classes: tuple[RequestClass, ...]
    arrival: ArrivalProcess
    num_requests: int
    seed: int = 0
    duration_s: float | None = None  # open loop: drop requests arriving later than this
    description: str = ""
    _cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_str("name", self.name)
        if not isinstance(self.arrival, ArrivalProcess):
            raise WorkloadError(f"arrival = {preview(self.arrival)}: must be an arrival process "
                                "(poisson, gamma, constant, closed_loop, trace)")
        if not isinstance(self.classes, (list, tuple)):
            raise WorkloadError(f"classes = {preview(self.classes)}: must be a list of "
                                "request classes")
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        check_int("num_requests", self.num_requests, lo=1, hi=MAX_NUM_REQUESTS)
        for c in classes:
            check_session_count(self.num_requests, getattr(c, "multi_turn", None))
        check_int("seed", self.seed, lo=0, hi=MAX_SEED)
        if self.duration_s is not None:
            object.__setattr__(self, "duration_s",
                               check_positive("duration_s", self.duration_s, hi=MAX_SECONDS))
        if isinstance(self.arrival, TraceReplay):
            if classes:
                raise WorkloadError("classes: a trace gives every request's lengths; remove "
                                    "classes or use another arrival process")
            if self.num_requests > len(self.arrival.specs):
                raise WorkloadError(f"num_requests = {self.num_requests}: the trace "
                                    f"{self.arrival.path!r} holds only {len(self.arrival.specs)}")
        else:
            if not classes:
                raise WorkloadError("classes = []: a workload needs at least one request class")
            for i, c in enumerate(classes):
                if not isinstance(c, RequestClass):
                    raise WorkloadError(f"classes[{i}] = {preview(c)}: must be a RequestClass")
                if c.name in (other.name for other in classes[:i]):
                    raise WorkloadError(f"classes[{i}].name = {preview(c.name)}: names must be "
                                        "unique")
            self._check_size(classes)
        object.__setattr__(self, "_cumulative", cumulative_shares([c.share for c in classes]))

    def _check_size(self, classes: tuple[RequestClass, ...]) -> None:
        """Refuse a workload whose expected tokens would not fit in memory (the simulator
        holds every token id), before any request is generated."""
        total_share = sum(c.share for c in classes)
        per_request = sum(c.share * c.mean_tokens() for c in classes) / total_share
        expected = self.num_requests * per_request
        if expected > MAX_WORKLOAD_TOKENS:
            raise WorkloadError(
                f"num_requests = {self.num_requests}: at about {per_request:,.0f} prompt + "
                f"output tokens an arrival (a whole session where a class has turns) that is "
                f"{expected:,.0f} tokens; a workload may "
                f"hold at most {MAX_WORKLOAD_TOKENS:,} (lower num_requests or the lengths)")

    @property
    def closed_loop_concurrency(self) -> int | None:
        return self.arrival.closed_loop_concurrency

    @property
    def shares(self) -> dict[str, float]:
        """Each class's share of requests, normalised to sum to 1."""
        total = sum(c.share for c in self.classes)
        return {c.name: c.share / total for c in self.classes}

    def generate(self) -> list[RequestSpec]:
        """The requests, sorted by arrival, indexed 0..n-1. Same seed, same list. A
        multi-turn class's arrival opens a session: its later turns follow their first,
        with its arrival as theirs (a lower bound: each is sent when the one before it
        has ended, sessions.py)."""
        # Two streams: arrival times and request contents. So changing only the rate (a
        # sweep) keeps every request's class and lengths, and the runs stay comparable.
        times = self.arrival.times(self.num_requests,
                                   random.Random(f"stepserve:{self.seed}:arrivals"))
        if self.duration_s is not None and self.closed_loop_concurrency is None:
            times = [t for t in times if t <= self.duration_s]
        if isinstance(self.arrival, TraceReplay):  # its requests, at those times
            return [dataclasses.replace(spec, index=index, arrival_s=t)
                    for index, (t, spec) in enumerate(zip(times, self.arrival.specs))]
        rng = random.Random(f"stepserve:{self.seed}:requests")
        specs: list[RequestSpec] = []
        tokens = 0
        for arrival_s in times:
            cls = self.classes[bisect.bisect_right(self._cumulative, rng.random())]
            made = cls.make_session(len(specs), arrival_s, rng)
            specs += made
            if len(specs) > MAX_NUM_REQUESTS:
                raise WorkloadError(f"num_requests = {self.num_requests}: its sessions "
                                    f"made more than {MAX_NUM_REQUESTS:,} requests (lower "
                                    "num_requests or the turns)")
            # the expected size was checked up front; a draw far above it stops here,
            # before the run holds its token ids
            tokens += sum(s.prompt_len + s.output_len for s in made)
            if tokens > MAX_WORKLOAD_TOKENS:
                raise WorkloadError(f"num_requests = {self.num_requests}: the requests drawn "
                                    f"hold more than {MAX_WORKLOAD_TOKENS:,} prompt + output "
                                    "tokens, the most a workload may hold (lower "
                                    "num_requests, the lengths or the turns)")
        return specs

    def describe(self) -> str:
        """A few lines for humans: arrivals, then each class with its lengths."""
        lines = [f"workload {self.name}: {self.num_requests} requests, seed {self.seed}, "
                 f"{self.arrival.describe()}"]
        if self.duration_s is not None:
            lines[0] += f", at most {self.duration_s:g} s"
        for c in self.classes:
            cap = f", max_tokens {c.max_tokens}" if c.max_tokens is not None else ""
            if c.pairs is not None:
                lines.append(f"  {c.name}: (prompt, output) pairs sampled jointly from "
                             f"{(c.dataset or {}).get('description', 'a dataset')}")
            lines.append(f"  {c.name} {self.shares[c.name]:.1%}: prompt {c.prompt.describe()}; "
                         f"output {c.output.describe()}{cap}; priority {c.priority}, "
                         f"tenant {c.tenant}" + (f"; prompts open with one of "
                         f"{c.shared_prefixes} shared prefixes of {c.prefix_len} tokens"
                         if c.shared_prefixes else "")
                         + (f"; {c.multi_turn.describe()}" if c.multi_turn else ""))
        return "\n".join(lines)
