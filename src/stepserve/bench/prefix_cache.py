"""The prefix cache as a bench run sees it: the hit rate from the answers' usage, the
repeated share from the prompts it built."""

from __future__ import annotations

from collections.abc import Sequence

from stepserve.bench.client import RequestRecord
from stepserve.metrics.percentiles import ratio
from stepserve.metrics.request_metrics import cacheable_tokens
from stepserve.metrics.run_summary import RunSummary
from stepserve.workload.sessions import next_turns
from stepserve.workload.spec import RequestSpec
from stepserve.workload.trace import TraceSpec


def prefix_cache_fields(done: Sequence[RequestRecord]) -> RunSummary:
    """The hit rate over the completed requests whose answer counted its cached tokens,
    and the repeated share over those the bench knows the prompts of; each only when
    there is a request to count it over."""
    values: dict[str, float | None] = {}
    for key, tokens in (("prefix_cache_hit_rate", "cached_tokens"),
                        ("prefix_repeated_share", "repeated_tokens")):
        if counted := [r for r in done if getattr(r, tokens) is not None]:
            values[key] = ratio(sum(getattr(r, tokens) for r in counted),
                                sum(prompt_tokens(r) for r in counted))
    return RunSummary.of(**values)


def prompt_tokens(r: RequestRecord) -> int:
    return r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len


def repeated_tokens(specs: Sequence[RequestSpec]) -> list[int]:
    """For each spec, the prompt tokens an earlier one's prompt began with. The prompts
    (prompt_maker.py) share exactly their shared prefix, so that is the prefix of any spec
    whose prefix came before, in the whole blocks a cache could give. A trace's prompts
    share what their hash ids do (`repeated_trace_tokens`)."""
    if specs and all(isinstance(s, TraceSpec) for s in specs):
        return repeated_trace_tokens(specs)  # type: ignore[arg-type]
    seen: set[str] = set()
    out = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: specs[i].arrival_s):
        s = specs[i]
        if s.prefix in seen:
            out[i] = cacheable_tokens(s.prefix_len, s.prompt_len)
        if s.prefix is not None:
            seen.add(s.prefix)
    for k, nxt in next_turns(specs).items():  # a session's turn: the prompt before it, too
        out[nxt] = cacheable_tokens(specs[k].prompt_len, specs[nxt].prompt_len)
    return out


def repeated_trace_tokens(specs: Sequence[TraceSpec]) -> list[int]:
    """For each request, the leading prompt tokens an earlier one began with, from the
    hash ids alone (the prompts share exactly their common hash-id prefix, a cut last
    block as far as both have it), in the whole blocks a cache could give."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node: the prefixes
    covered: list[int] = [0]  # per node, the most tokens an earlier prompt had along it
    out = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: specs[i].arrival_s):
        s = specs[i]
        node, shared, path = 0, 0, []
        for depth, h in enumerate(s.hash_ids, start=1):
            child = nodes.get((node, h))
            if child is None:
                child = nodes[(node, h)] = len(covered)
                covered.append(0)
            elif shared == (depth - 1) * s.block_tokens:  # still on an earlier prompt
                shared = covered[child]
            node = child
            path.append((child, min(s.prompt_len, depth * s.block_tokens)))
        out[i] = cacheable_tokens(min(shared, s.prompt_len), s.prompt_len)
        for child, tokens in path:
            covered[child] = max(covered[child], tokens)
    return out
