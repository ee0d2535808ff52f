"""Built-in workloads, by name: the three incidents' traffic and the quick-start load.
Each docstring's first paragraph is the workload's description; docs/guide.md tells the
incidents' stories, and the engine configs live with the simulator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from stepserve.workload.arrivals import ClosedLoop, JobRounds, Poisson, RateSchedule
from stepserve.workload.errors import WorkloadError
from stepserve.workload.lengths import fixed, lognormal, uniform
from stepserve.workload.spec import RequestClass, Workload


def _doc(fn: Callable[..., Workload]) -> str:
    """The docstring's first paragraph, on one line: the workload's description."""
    first = (fn.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def night_report(num_requests: int = 6400, seed: int = 0, concurrency: int = 64) -> Workload:
    """Nightly report job: every round of 64 is 54 short reports (20 output tokens) and 10
    long ones (2,000), exactly, 64 in flight.

    The incident's own mix (static batching fills 21,080 of 128,000 slot-steps, 16.5%);
    prompts of 128 tokens (64 make one 8,192-token prefill). 6,400 requests are 100
    rounds; `seed` changes nothing.
    """
    arrival = JobRounds(concurrency=concurrency,
                        groups=(("short", 54, 128, 20), ("long", 10, 128, 2000)))
    return Workload("night-report", (), arrival, num_requests, seed,
                    description=_doc(night_report))


def mixed_pool(num_requests: int = 2000, seed: int = 0, rate: float = 0.8) -> Workload:
    """Mixed pool: 30% 8K-token summaries with 70% ~300-token chats, Poisson arrivals.

    At 0.8 req/s of ~2,670 prompt tokens on the incident's ~5,000 prompt tokens/s, prefill
    takes ~45% of the engine, enough for four summaries to fill a step now and then (chat
    TTFT P99 1.1 s -> 6.9 s). Needs max_model_len >= 8,442 (8,192 + 250).
    """
    classes = (
        RequestClass("summary", 0.3, fixed(8192), uniform(150, 250), priority=1,
                     tenant="summary"),
        RequestClass("chat", 0.7, lognormal(300, 900, max=2048), uniform(100, 300),
                     priority=0, tenant="chat"),
    )
    return Workload("mixed-pool", classes, Poisson(rate), num_requests, seed,
                    description=_doc(mixed_pool))


# 660 requests/min until 20:00 (t = 0 here), rising to 980/min by 20:01, held there.
PROMO_SCHEDULE = ((0.0, 11.0), (60.0, 980 / 60))


def _promo_classes() -> tuple[RequestClass, ...]:
    """Customer service: mean output 0.94 * 194 + 0.06 * 1,600 = ~278 tokens, 6% over
    1,200 (`long`, priority 1: it queues behind live chat, hence the fix's aging). Prompts
    P50 580, at which two replicas of 64 just fall behind 980 requests/min; max_tokens
    2,048 keeps prompt + max_tokens within the incident's 4K."""
    prompt = lognormal(580, 2048, max=2048)
    return (
        RequestClass("short", 0.94, prompt, lognormal(150, 800, max=1200), max_tokens=2048),
        RequestClass("long", 0.06, prompt, uniform(1201, 2000), max_tokens=2048,
                     priority=1),
    )


def promo_spike(num_requests: int = 4740, seed: int = 0) -> Workload:
    """Promotion spike: 660 requests/min rising to 980/min at 20:00, mean output ~280
    tokens, 6% long.

    The default 4,740 requests are the first five minutes from 20:00.
    """
    return Workload("promo-spike", _promo_classes(), RateSchedule(PROMO_SCHEDULE),
                    num_requests, seed, description=_doc(promo_spike))


def promo_spike_closed(num_requests: int = 4900, seed: int = 0,
                       concurrency: int = 140) -> Workload:
    """Promotion spike as 140 concurrent users (closed loop), same request mix.

    Against max_num_seqs 128 at least 12 wait; the fix is judged on this load too.
    """
    return Workload("promo-spike-closed", _promo_classes(), ClosedLoop(concurrency),
                    num_requests, seed, description=_doc(promo_spike_closed))


def quickstart(num_requests: int = 1200, seed: int = 0, rate: float = 8.0) -> Workload:
    """Quick start: a fixed moderate mixed load for comparing configs A, B and C.

    1,200 requests at 8 req/s (2.5 minutes) stay below config A's knee, so all three carry
    the load and only their latencies differ; all fit max_model_len 4,096.
    """
    classes = (
        RequestClass("chat", 0.8, lognormal(300, 1500, max=2048),
                     lognormal(150, 800, max=1024)),
        RequestClass("document", 0.2, uniform(1500, 3000), uniform(100, 400)),
    )
    return Workload("quickstart", classes, Poisson(rate), num_requests, seed,
                    description=_doc(quickstart))


SCENARIOS: dict[str, Callable[..., Workload]] = {
    fn.__name__.replace("_", "-"): fn
    for fn in (night_report, mixed_pool, promo_spike, promo_spike_closed, quickstart)}


def list_workloads() -> list[str]:
    return list(SCENARIOS)


def get_workload(name: str, **overrides: object) -> Workload:
    """A built-in workload by name (`night_report` works as well as `night-report`), with
    keyword overrides such as num_requests, seed, rate or concurrency."""
    key = name.replace("_", "-") if isinstance(name, str) else name
    if key not in SCENARIOS:
        raise WorkloadError(f"workload = {name!r}: unknown; built-in workloads: "
                            f"{', '.join(SCENARIOS)}")
    fn = SCENARIOS[key]
    params = list(inspect.signature(fn).parameters)
    for option in overrides:
        if option not in params:
            raise WorkloadError(f"{key}: unknown option {option!r}; allowed: "
                                f"{', '.join(params)}")
    return fn(**overrides)
