"""RunSummary: one run's numbers as typed fields, whatever measured them. A field is None
where its source does not measure it or it is undefined, so a rule whose inputs are None
cannot run. `reported` names the fields the source reports, in JSON order: `to_json`
writes exactly those, `from_json` drops unknown keys and values of the wrong kind.
`allowed` says which numbers a field can hold, so a file with impossible ones is refused.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from stepserve.config.validate import Allowed


@dataclass(frozen=True, slots=True)
class RunSummary:
    # ---- requests (any outcome; latencies from completed ones: request_metrics.py) ----
    requests_total: float | None = None
    requests_finished: float | None = None  # stop or length
    requests_rejected: float | None = None
    rejected_by_reason: dict[str, int] | None = None  # RejectReason value -> count
    requests_timed_out: float | None = None
    requests_aborted: float | None = None
    requests_failed: float | None = None  # a fault in their step (bench: an error answer)
    requests_unfinished: float | None = None  # still live
    output_tokens: float | None = None  # every generated token, any outcome
    prompt_tokens: float | None = None  # prompts of requests that ran at least once
    duration_s: float | None = None
    throughput_tokens_per_s: float | None = None  # output_tokens / duration_s
    throughput_requests_per_s: float | None = None  # requests_finished / duration_s
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    itl_mean_s: float | None = None  # ITL pools every gap of every completed request
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    e2e_mean_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None
    queue_time_mean_s: float | None = None
    queue_time_p50_s: float | None = None
    queue_time_p95_s: float | None = None
    queue_time_p99_s: float | None = None
    p99_p50_e2e_ratio: float | None = None
    p99_p50_ttft_ratio: float | None = None
    p99_p50_tpot_ratio: float | None = None
    preemptions: float | None = None  # sum of num_preemptions
    preempted_requests: float | None = None
    long_request_threshold: float | None = None  # output tokens
    long_requests: float | None = None  # output over the threshold
    long_request_share: float | None = None
    preemptions_on_long_share: float | None = None  # of preemptions, on long requests
    swapped_blocks: float | None = None
    recomputed_tokens: float | None = None
    # the prefix cache over completed requests: cached prompt tokens / prompt tokens, and
    # the share of prompt tokens an earlier prompt began with (what a cache that never
    # evicted could give: request_metrics.py)
    prefix_cache_hit_rate: float | None = None
    prefix_repeated_share: float | None = None
    # ---- steps (step_metrics.py; queue levels summed over replicas) ----
    replicas: float | None = None
    steps: float | None = None
    mean_step_s: float | None = None
    decode_step_p50_s: float | None = None  # median step with decode tokens
    step_p50_s: float | None = None  # every step (a scrape: the step-time histogram)
    step_p99_s: float | None = None
    step_max_s: float | None = None
    slot_utilization: float | None = None  # sum num_active / sum slots_held
    active_ratio_p50: float | None = None  # per step num_active / slots_held
    active_ratio_mean: float | None = None
    prefill_step_share: float | None = None  # steps with prefill and no decode tokens
    zero_decode_step_share: float | None = None  # decode-ready sequences, no decode token
    prefill_token_share: float | None = None
    prefill_tokens_computed: float | None = None  # recompute included
    decode_tokens_computed: float | None = None
    waiting_max: float | None = None
    waiting_p50: float | None = None
    waiting_mean: float | None = None
    waiting_nonzero_share: float | None = None  # share of samples with a queue
    waiting_growth: float | None = None  # least-squares slope (requests/s) while arriving
    waiting_trend_rise: float | None = None  # that slope times that window
    waiting_monotonic_rise_s: float | None = None  # longest stretch that never shrank
    waiting_monotonic_rise: float | None = None  # and how much it grew in it
    running_max: float | None = None
    running_mean: float | None = None
    in_engine_max: float | None = None  # running + waiting + swapped
    kv_usage_max: float | None = None
    kv_usage_mean: float | None = None
    # when each alert would first have fired, seconds from the run's start (rules.alert_times;
    # reported as None: measured, never fired; not reported: no series to time it)
    alert_queue_at_s: float | None = None  # waiting queue reached 10
    alert_ttft_p99_at_s: float | None = None  # rolling TTFT P99 over 5 s
    alert_prefill_share_at_s: float | None = None  # prefill-only > 70% / zero-decode > 10%
    alert_low_active_at_s: float | None = None  # active / slots held < 30%, sustained
    alert_low_slot_util_at_s: float | None = None  # slot utilisation since the start < 50%
    # ---- the settings the doctor's advice names (sim/run.py copies them in) ----
    batching: str | None = None
    max_num_seqs: float | None = None
    max_num_batched_tokens: float | None = None
    long_prefill_token_threshold: float | None = None
    enable_chunked_prefill: bool | None = None
    budget_order: str | None = None
    max_waiting: float | None = None
    # ---- a server's /metrics (live_window.py over a window, bench/loadgen.py over a run) ----
    window_s: float | None = None
    scrape_samples: float | None = None
    metrics_source: str | None = None  # stepserve, vllm, sglang, tgi, or engine
    scrape_failures: float | None = None  # scrapes that failed and were skipped
    scrape_error: str | None = None  # the first of them
    generation_tokens: float | None = None
    server_requests_finished: float | None = None
    server_generation_tokens: float | None = None
    server_prompt_tokens: float | None = None
    # vLLM's waiting queue by why a request waits ("capacity": for a slot; "deferred": held
    # by a passing constraint such as a LoRA budget or a KV transfer), over the scrapes
    waiting_by_reason_max: dict[str, float] | None = None
    waiting_by_reason_p50: dict[str, float] | None = None
    # the quantiles whose histogram bucket is wide: {field: {"lower", "upper"}} (upper
    # None: the +Inf bucket); the rules read them at a bound (quantile_bounds.py)
    quantile_bounds: dict[str, dict[str, float | None]] | None = None
    # ---- a bench run's client side (bench/results.py) ----
    requests_not_sent: float | None = None  # cut off by --duration-s or an interrupt
    errors: dict[str, int] | None = None  # outcome -> count, e.g. http_500
    error_examples: dict[str, str | None] | None = None  # outcome -> its first message
    goodput_requests_per_s: float | None = None
    goodput_requests: float | None = None
    goodput_slo: str | None = None
    peak_concurrency: float | None = None
    warmup_requests: float | None = None
    interrupted: bool | None = None
    # ---- the CPU the engine shared (host/cpu_share.py, host/step_reference.py):
    # from the engine's process (bench --engine), a server's /metrics, or the bench
    # client's own machine (cpu_source says which) ----
    cpu_others_cores: float | None = None  # other processes' CPU s / wall s (normal nice)
    cpu_wait_share: float | None = None  # run-queue wait / (on cpu + wait), engine threads
    cpu_usable: float | None = None  # usable cores
    step_time_over_quiet: float | None = None  # recent step time / its shapes' quiet time
    cpu_source: str | None = None  # engine, server or client
    # the fields the source reports, in JSON order (see the module docstring)
    reported: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in self.reported if name not in FIELD_KINDS]
        if unknown:
            raise ValueError(f"RunSummary.reported: not fields: {', '.join(unknown)}")

    @classmethod
    def of(cls, **values: Any) -> RunSummary:
        """A summary that reports exactly `values`, in that order."""
        return cls(**values, reported=tuple(values))

    def updated(self, other: RunSummary) -> RunSummary:
        """This summary with `other`'s reported fields laid over it; a field both report
        keeps its place in the order (as dict.update would)."""
        values = {name: getattr(other, name) for name in other.reported}
        order = self.reported + tuple(n for n in other.reported if n not in self.reported)
        return replace(self, **values, reported=order)

    def with_values(self, **values: Any) -> RunSummary:
        """This summary with `values` set and reported."""
        return self.updated(RunSummary.of(**values))

    def only(self, names: tuple[str, ...]) -> RunSummary:
        """The same values, reporting only those of `names` it reports, in its order."""
        return replace(self, reported=tuple(n for n in self.reported if n in names))

    def metric(self, name: str) -> float | None:
        """A number chosen by name where a user names it (`--slo`, `--p99-metric`, a
        table's columns); ValueError for a name that is no numeric field."""
        if FIELD_KINDS.get(name) is not float:
            raise ValueError(f"{name!r} is not a number of a run's summary")
        return getattr(self, name)

    def to_json(self) -> dict[str, Any]:
        return {name: dict(v) if isinstance(v := getattr(self, name), dict) else v
                for name in self.reported}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        values = {k: v if value_kind(v) is FIELD_KINDS[k] else None
                  for k, v in data.items() if k in FIELD_KINDS}
        return cls(**values, reported=tuple(values))


def value_kind(value: Any) -> type:
    """A JSON value's kind as FIELD_KINDS names kinds: float for any number (a bool is
    none), bool, str, dict, or the value's own type (list, NoneType)."""
    if isinstance(value, bool):
        return bool
    return float if isinstance(value, (int, float)) else type(value)


def _kind(hint: Any) -> type:
    """float, str, bool or dict: the non-None part of a field's type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(args[0]) or args[0]
    return base if base in (str, bool, dict) else float


_HINTS = typing.get_type_hints(RunSummary)
FIELD_KINDS: dict[str, type] = {f.name: _kind(_HINTS[f.name]) for f in fields(RunSummary)
                                if f.name != "reported"}
_NAMES = list(FIELD_KINDS)
# the fields by what measures them, in declaration (and JSON) order
REQUEST_FIELDS = tuple(_NAMES[: _NAMES.index("replicas")])
STEP_FIELDS = tuple(_NAMES[_NAMES.index("replicas"): _NAMES.index("batching")])


def field_name(attribute: Any) -> str:
    """The name of a RunSummary field given as the class attribute (`RunSummary.
    preemptions`); TypeError for anything else, so a rule's inputs are real fields."""
    if not (isinstance(attribute, types.MemberDescriptorType)
            and attribute.__objclass__ is RunSummary and attribute.__name__ in FIELD_KINDS):
        raise TypeError(f"{attribute!r} is not a field of RunSummary (write RunSummary.NAME)")
    return attribute.__name__


# fitted slopes of the waiting queue: a queue that drains has a negative one
SIGNED_KEYS = frozenset({"waiting_growth", "waiting_trend_rise"})
# far beyond any count, token total or duration a run can have; keeps the rules' float
# arithmetic from overflowing on a 400-digit integer
MAGNITUDE_MAX = 1e18


def _is_share(key: str) -> bool:
    return key.endswith("_share") or key in ("slot_utilization", "prefix_cache_hit_rate") \
        or key.startswith(("active_ratio_", "kv_usage_"))


def allowed(key: str) -> Allowed:
    """What the number under `key` may be, by its name: the queue's fitted slopes may be
    negative, shares lie in [0, 1], every other number (counts, seconds, ratios, settings)
    is >= 0; all are finite."""
    if key in SIGNED_KEYS:
        return Allowed(-MAGNITUDE_MAX, MAGNITUDE_MAX, float)
    if _is_share(key):
        return Allowed(0.0, 1.0, float, note=" (a share)")
    return Allowed(0.0, MAGNITUDE_MAX, float)
