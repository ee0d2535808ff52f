"""The load a bench run offered, as its result records it (`load` in the bench JSON, and
the setup keys of a `--save-result` file): rate, burstiness, concurrency cap, count,
seed, dataset and lengths, and how the requests were sent."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from stepserve.bench.loadgen import LoadPlan
from stepserve.bench.prompt_maker import PromptMaker, load_tokenizer
from stepserve.bench.vllm_result import VllmSetup
from stepserve.workload.arrivals import Constant, Gamma
from stepserve.workload.spec import Workload

if TYPE_CHECKING:
    from stepserve.bench.job import BenchOptions
    from stepserve.bench.results import BenchRun


def prompt_maker(token_ids: bool, tokenizer: str | None, seed: int) -> PromptMaker:
    """Token ids, or text (of exact length when a tokenizer is named)."""
    tok = load_tokenizer(tokenizer) if tokenizer and not token_ids else None
    return PromptMaker(token_ids=token_ids, tokenizer=tok, seed=seed)


def _rate_and_burstiness(options: BenchOptions, workload: Workload) -> tuple[float, float]:
    rate = options.workload.offered_rate()
    arrival = workload.arrival
    if rate is None:  # the workload's own arrivals; a closed loop or a trace: inf
        rate = getattr(arrival, "rate_per_s", math.inf)
    burstiness = options.workload.burstiness
    if burstiness is None:
        burstiness = arrival.burstiness if isinstance(arrival, Gamma) else \
            math.inf if isinstance(arrival, Constant) else 1.0
    return float(rate), float(burstiness)


def _json_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def offered_load(options: BenchOptions, workload: Workload, plan: LoadPlan
                 ) -> dict[str, Any]:
    """The offered load, JSON-ready (an infinite rate or burstiness as "inf")."""
    w = options.workload
    rate, burstiness = _rate_and_burstiness(options, workload)
    out: dict[str, Any] = {
        "request_rate": _json_float(rate), "burstiness": _json_float(burstiness),
        "max_concurrency": plan.concurrency, "num_prompts": len(plan.specs) - plan.warmup,
        "warmup": plan.warmup, "seed": workload.seed, "arrival": workload.arrival.describe(),
        "duration_s": plan.duration_s}
    dataset = w.dataset()
    if dataset == "random":
        cls = workload.classes[0]
        out.update(dataset="random", input_len=cls.prompt.describe(),
                   output_len=cls.output.describe(), range_ratio=w.random_range_ratio or 0.0)
    elif dataset == "prefix_repetition":
        prefix_len, suffix_len, num_prefixes, output_len = w.prefix_repetition()
        out.update(dataset=dataset, prefix_len=prefix_len, suffix_len=suffix_len,
                   num_prefixes=num_prefixes, output_len=output_len)
    elif dataset == "sharegpt":
        out.update(dataset="sharegpt", dataset_path=w.sharegpt,
                   sharegpt_output_len=w.sharegpt_output_len)
    elif dataset == "mooncake":
        out.update(dataset=dataset, dataset_path=w.sharegpt, trace_slowdown=w.trace_slowdown)
    else:
        out["dataset"] = f"scenario {w.scenario}" if w.scenario else f"workload {w.workload}"
    sessions = {c.name: c.multi_turn.to_dict() for c in workload.classes if c.multi_turn}
    if sessions:  # num_prompts counts their turns; the arrivals time only first turns
        out.update(multi_turn=sessions,
                   sessions=sum(1 for s in plan.specs[plan.warmup:] if s.turn == 0))
    if options.target:
        out.update(endpoint=options.shape.endpoint, sampling=dict(options.shape.sampling))
    out["ignore_eos"] = plan.ignore_eos
    return out


def vllm_setup(options: BenchOptions, run: BenchRun) -> VllmSetup:
    """The setup keys of the `--save-result` file."""
    load = run.load or {}
    model = run.model or options.model or str(run.target)
    return VllmSetup(
        backend=options.backend, model_id=model,
        tokenizer_id=options.workload.tokenizer or model,
        num_prompts=int(load.get("num_prompts", 0)),
        request_rate=float(load.get("request_rate", math.inf)),
        burstiness=float(load.get("burstiness", 1.0)),
        max_concurrency=load.get("max_concurrency"), label=options.save.label,
        metadata=options.save.metadata)
