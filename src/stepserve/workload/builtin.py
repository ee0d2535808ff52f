"""Built-in workloads, by name: the three incidents' traffic and the quick-start load.

Each function's docstring opens with the workload's description, then ties its numbers to
its incident (docs/guide.md tells each story); the engine configs live with the simulator.
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

    The night-report incident's own mix (output P50 20 / P99 2,000; static 64-slot
    batching fills 21,080 of 128,000 slot-steps, 16.5%), not sampled. Short reports go
    first, so under static batching a round's long ones are sent as the round before ends
    and run in the next batch. Prompts 128 tokens (the incident gives none: 64 of them make
    one 8,192-token prefill step). 6,400 requests are 100 rounds; `seed` changes nothing.
    """
    arrival = JobRounds(concurrency=concurrency,
                        groups=(("short", 54, 128, 20), ("long", 10, 128, 2000)))
    return Workload("night-report", (), arrival, num_requests, seed,
                    description=_doc(night_report))


def mixed_pool(num_requests: int = 2000, seed: int = 0, rate: float = 0.8) -> Workload:
    """Mixed pool: 30% 8K-token summaries with 70% ~300-token chats, Poisson arrivals.

    The mixed-pool incident (chunk cap = step budget = 32,768: chat TTFT P99 1.1 s -> 6.9
    s when four 8K summaries fill one step). Rate 0.8 req/s: on the incident's engine
    (~5,000 prompt tokens/s) a request brings ~2,670 prompt tokens on average, so prefill
    takes ~45% of the engine's time; summaries then pile up now and then, four of them
    fill a step, and a bad budget split shows. Calibrate `rate` to your cost model. Needs
    max_model_len >= 8,442 (8,192 + 250).
    """
    classes = (
        RequestClass("summary", 0.3, fixed(8192), uniform(150, 250), priority=1,
                     tenant="summary"),
        RequestClass("chat", 0.7, lognormal(300, 900, max=2048), uniform(100, 300),
                     priority=0, tenant="chat"),
    )
    return Workload("mixed-pool", classes, Poisson(rate), num_requests, seed,
                    description=_doc(mixed_pool))


# The promotion's traffic curve: 660 requests/min until 20:00 (t = 0 here), rising to
# 980/min by 20:01, held there.
PROMO_SCHEDULE = ((0.0, 11.0), (60.0, 980 / 60))


def _promo_classes() -> tuple[RequestClass, ...]:
    """Customer service: mean output ~280 tokens, 6% of requests over 1,200 tokens.

    Mean output 0.94 * 194 (short) + 0.06 * 1,600 (long) = ~278. `long` has priority 1:
    long-form answers queue behind live chat, which is why the incident's fix adds aging.
    Prompts P50 580 (the incident gives none: at that two replicas capped at 64 running
    each just fall behind 980 requests/min, as the incident's queue did). max_tokens 2,048
    so prompt + max_tokens <= 4,096, the 4K length the incident sizes concurrency by.
    """
    prompt = lognormal(580, 2048, max=2048)
    return (
        RequestClass("short", 0.94, prompt, lognormal(150, 800, max=1200), max_tokens=2048),
        RequestClass("long", 0.06, prompt, uniform(1201, 2000), max_tokens=2048,
                     priority=1),
    )


def promo_spike(num_requests: int = 4740, seed: int = 0) -> Workload:
    """Promotion spike: 660 requests/min rising to 980/min at 20:00, mean output ~280
    tokens, 6% long.

    The promo-spike incident (from 20:00 concurrency 96 -> 140 on max_num_seqs 128,
    980 req/min, preemptions on requests over 1,200 output tokens, which are 6% of
    traffic). The default 4,740 requests are the first five minutes from 20:00.
    """
    return Workload("promo-spike", _promo_classes(), RateSchedule(PROMO_SCHEDULE),
                    num_requests, seed, description=_doc(promo_spike))


def promo_spike_closed(num_requests: int = 4900, seed: int = 0,
                       concurrency: int = 140) -> Workload:
    """Promotion spike as 140 concurrent users (closed loop), same request mix.

    The promo-spike incident's "并发到 140" against max_num_seqs 128: with 140 always in
    flight, 12 wait at the very least; the fix (3 replicas, max_num_seqs 40, max_waiting
    24) is judged against this load as well as the open-loop one.
    """
    return Workload("promo-spike-closed", _promo_classes(), ClosedLoop(concurrency),
                    num_requests, seed, description=_doc(promo_spike_closed))


def quickstart(num_requests: int = 1200, seed: int = 0, rate: float = 8.0) -> Workload:
    """Quick start: a fixed moderate mixed load for comparing configs A, B and C.

    A (small max_num_batched_tokens, moderate max_num_seqs), B (both large) and C
    (chunked prefill, capped request length), compared on P50/P95/P99, throughput and
    preemptions. 1,200 requests at 8 req/s, 2.5 minutes: below config A's knee, where all
    three carry the load and only their latencies differ; everything fits max_model_len
    4,096. Sweep `rate` to find the knee.
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
